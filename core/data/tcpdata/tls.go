package tcpdata

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"
)

// Encrypted mode (version 2); see doc.go.
const (
	encryptedVersion = 2
	exporterLabel    = "EXPORTER-peerkv-tcpdata-v2"
	exporterLen      = 32
	clientMACContext = "peerkv/tcpdata/v2/client"
	serverMACContext = "peerkv/tcpdata/v2/server"
)

// The mismatch messages name the fix: the setting differs between peers.
const (
	errPeerPlain     = "the peer's data path is not encrypted: set encrypt on every peer"
	errPeerEncrypted = "the peer's data path is encrypted and ours is not: set encrypt on every peer"
)

// tlsConfigs are one transport's TLS settings, made at New.
type tlsConfigs struct {
	server, client *tls.Config
}

// newTLSConfigs makes an ephemeral self-signed identity. Nobody verifies it:
// the exporter-bound HMAC hello authenticates both ends (see clientConfig).
func newTLSConfigs() (*tlsConfigs, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("tcpdata: TLS key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("tcpdata: TLS serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: "peerkv tcpdata"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.AddDate(10, 0, 0),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("tcpdata: TLS certificate: %w", err)
	}
	return &tlsConfigs{
		server: &tls.Config{
			MinVersion:             tls.VersionTLS13,
			Certificates:           []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
			SessionTicketsDisabled: true, // no resumption: every connection is a full handshake
		},
		client: &tls.Config{
			MinVersion: tls.VersionTLS13,
			// Accepting any certificate is safe ONLY because the hello that
			// follows authenticates: both MACs cover this connection's TLS
			// exporter, which a man in the middle (two TLS sessions, two
			// exporters) cannot make match without the shared secret.
			InsecureSkipVerify: true,
		},
	}, nil
}

// helloConn is the connection a hello runs on: the raw TCP connection in
// plaintext mode (version 1), or the TLS connection and its exporter.
type helloConn struct {
	net.Conn
	exporter []byte // nil in plaintext mode
}

func (h helloConn) encrypted() bool { return h.exporter != nil }

func (h helloConn) version() uint8 {
	if h.encrypted() {
		return encryptedVersion
	}
	return protocolVersion
}

// clientFixedLen is the fixed part of the client hello: version 2 adds the
// client nonce.
func (h helloConn) clientFixedLen() int {
	if h.encrypted() {
		return clientHelloLen + nonceLen
	}
	return clientHelloLen
}

// startServerTLS announces encrypted mode in the clear (a version-2 server
// hello with a zero nonce) and runs the TLS handshake as its server, under
// the deadline already set on raw.
func (t *Transport) startServerTLS(raw net.Conn) (helloConn, error) {
	var notice [serverHelloLen]byte
	binary.LittleEndian.PutUint32(notice[0:], helloMagic)
	notice[4] = encryptedVersion
	notice[5] = 1
	if _, err := raw.Write(notice[:]); err != nil {
		return helloConn{}, fmt.Errorf("send hello: %w", err)
	}
	tc := tls.Server(raw, t.tls.server)
	if err := tc.Handshake(); err != nil {
		var rec tls.RecordHeaderError
		if errors.As(err, &rec) {
			return helloConn{}, errors.New("the writer's data path is not encrypted: set encrypt on every peer")
		}
		return helloConn{}, fmt.Errorf("TLS handshake: %w", err)
	}
	return exported(tc)
}

// startClientTLS runs the TLS handshake as the client, under the deadline
// already set on raw.
func (t *Transport) startClientTLS(raw net.Conn) (helloConn, error) {
	tc := tls.Client(raw, t.tls.client)
	if err := tc.Handshake(); err != nil {
		return helloConn{}, fmt.Errorf("TLS handshake: %w", err)
	}
	return exported(tc)
}

func exported(tc *tls.Conn) (helloConn, error) {
	cs := tc.ConnectionState()
	if cs.Version != tls.VersionTLS13 {
		return helloConn{}, fmt.Errorf("TLS version %#x, need 1.3", cs.Version)
	}
	exp, err := cs.ExportKeyingMaterial(exporterLabel, nil, exporterLen)
	if err != nil {
		return helloConn{}, fmt.Errorf("TLS exporter: %w", err)
	}
	return helloConn{Conn: tc, exporter: exp}, nil
}

// clientMAC is the producer's version-2 proof of the secret.
func clientMAC(secret string, serverNonce, clientNonce []byte, rowLen uint64, exporter []byte, peerID string) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(clientMACContext))
	m.Write(serverNonce)
	m.Write(clientNonce)
	var rl [8]byte
	binary.LittleEndian.PutUint64(rl[:], rowLen)
	m.Write(rl[:])
	m.Write(exporter)
	m.Write([]byte(peerID))
	return m.Sum(nil)
}

// serverMAC is the receiver's version-2 proof of the secret; its own
// context keeps it from ever equalling a client MAC.
func serverMAC(secret string, clientNonce, serverNonce, exporter []byte, peerID string) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(serverMACContext))
	m.Write(clientNonce)
	m.Write(serverNonce)
	m.Write(exporter)
	m.Write([]byte(peerID))
	return m.Sum(nil)
}

// sendVersionNotice tells a receiver of the other mode why we leave: the
// fixed part of a client hello with our version, zeros elsewhere. A
// plaintext receiver refuses it as a version; a TLS receiver sees no TLS.
func sendVersionNotice(c net.Conn, version uint8) {
	var b [clientHelloLen]byte
	binary.LittleEndian.PutUint32(b[0:], helloMagic)
	b[4] = version
	_, _ = c.Write(b[:])
}

// versionError explains a receiver's version from the producer's side.
func versionError(peerID string, theirs, ours uint8) error {
	switch {
	case ours == encryptedVersion && theirs == protocolVersion:
		return fmt.Errorf("%w: %s: %s", ErrHandshake, peerID, errPeerPlain)
	case ours == protocolVersion && theirs == encryptedVersion:
		return fmt.Errorf("%w: %s: %s", ErrHandshake, peerID, errPeerEncrypted)
	}
	return fmt.Errorf("%w: %s speaks data protocol version %d, we speak %d", ErrHandshake, peerID, theirs, ours)
}

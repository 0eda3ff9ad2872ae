package zmqctl

import (
	"crypto/ecdh"
	"crypto/hkdf"
	"crypto/sha256"
	"errors"
	"fmt"

	zmq "github.com/pebbe/zmq4"
)

// HKDF labels: each key is bound to its role, so the two secret keys differ.
const (
	curveServerLabel = "peerkv curve server v1"
	curveClientLabel = "peerkv curve client v1"
)

// curveMessageOverhead is what CURVE adds to every frame on the wire (the
// MESSAGE command name, nonce, MAC and flags byte); ZMQ_MAXMSGSIZE counts
// it, so it is added to keep MaxFrameBytes a payload bound in both modes.
const curveMessageOverhead = 33

// ErrCurveUnsupported: the libzmq loaded here was built without CURVE.
var ErrCurveUnsupported = errors.New("libzmq has no CURVE support (built without libsodium or tweetnacl)")

// CurveKeys are the Z85-encoded (40 characters) keys of one cluster. Every
// node uses the same pair for each role: the ROUTER is the CURVE server,
// every DEALER a CURVE client.
type CurveKeys struct {
	ServerPublic, ServerSecret string
	ClientPublic, ClientSecret string
}

// curveAvailable reports whether libzmq has CURVE; a variable so a test can
// stand in a libzmq without it.
var curveAvailable = zmq.HasCurve

// DeriveCurveKeys derives the cluster's CURVE keys from its shared secret
// (HKDF-SHA256, one label per role; public keys by X25519), so operators
// manage one secret.
func DeriveCurveKeys(secret string) (CurveKeys, error) {
	if secret == "" {
		return CurveKeys{}, errors.New("zmqctl: CURVE keys need a non-empty secret")
	}
	serverPublic, serverSecret, err := deriveKeyPair(secret, curveServerLabel)
	if err != nil {
		return CurveKeys{}, err
	}
	clientPublic, clientSecret, err := deriveKeyPair(secret, curveClientLabel)
	if err != nil {
		return CurveKeys{}, err
	}
	return CurveKeys{ServerPublic: serverPublic, ServerSecret: serverSecret,
		ClientPublic: clientPublic, ClientSecret: clientSecret}, nil
}

func deriveKeyPair(secret, label string) (public, private string, err error) {
	raw, err := hkdf.Key(sha256.New, []byte(secret), nil, label, 32)
	if err != nil {
		return "", "", fmt.Errorf("zmqctl: derive %q: %w", label, err)
	}
	key, err := ecdh.X25519().NewPrivateKey(raw)
	if err != nil {
		return "", "", fmt.Errorf("zmqctl: derive %q: %w", label, err)
	}
	return zmq.Z85encode(string(key.PublicKey().Bytes())), zmq.Z85encode(string(raw)), nil
}

// validate fails early and clearly where libzmq would later refuse the
// keys, or accept a mismatched pair and fail every handshake silently.
func (k *CurveKeys) validate() error {
	if !curveAvailable() {
		return fmt.Errorf("zmqctl: Options.Curve: %w", ErrCurveUnsupported)
	}
	pairs := []struct{ role, public, secret string }{
		{"server", k.ServerPublic, k.ServerSecret},
		{"client", k.ClientPublic, k.ClientSecret},
	}
	for _, p := range pairs {
		if len(p.public) != 40 || len(p.secret) != 40 {
			return fmt.Errorf("zmqctl: Options.Curve: %s keys must be 40 Z85 characters", p.role)
		}
		derived, err := zmq.AuthCurvePublic(p.secret)
		if err != nil {
			return fmt.Errorf("zmqctl: Options.Curve: %s secret key: %w", p.role, err)
		}
		if derived != p.public {
			return fmt.Errorf("zmqctl: Options.Curve: %s public key does not match its secret key", p.role)
		}
	}
	return nil
}

// maxMsgSize is ZMQ_MAXMSGSIZE for o: the payload bound plus what the
// security mechanism adds per frame.
func maxMsgSize(o Options) int64 {
	if o.Curve != nil {
		return int64(o.MaxFrameBytes) + curveMessageOverhead
	}
	return int64(o.MaxFrameBytes)
}

// secureRouter makes sock a CURVE server when o asks for it.
func secureRouter(sock *zmq.Socket, o Options) error {
	if o.Curve == nil {
		return nil
	}
	if err := sock.SetCurveServer(1); err != nil {
		return fmt.Errorf("set curve server: %w", err)
	}
	if err := sock.SetCurveSecretkey(o.Curve.ServerSecret); err != nil {
		return fmt.Errorf("set curve secret key: %w", err)
	}
	return nil
}

// secureDealer makes sock a CURVE client of the cluster's server key.
func secureDealer(sock *zmq.Socket, o Options) error {
	if o.Curve == nil {
		return nil
	}
	settings := []struct {
		what string
		set  func(string) error
		key  string
	}{
		{"server key", sock.SetCurveServerkey, o.Curve.ServerPublic},
		{"public key", sock.SetCurvePublickey, o.Curve.ClientPublic},
		{"secret key", sock.SetCurveSecretkey, o.Curve.ClientSecret},
	}
	for _, s := range settings {
		if err := s.set(s.key); err != nil {
			return fmt.Errorf("set curve %s: %w", s.what, err)
		}
	}
	return nil
}

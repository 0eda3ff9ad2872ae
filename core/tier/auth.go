package tier

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"

	"github.com/peerkv/peerkv/core/protocol"
)

const capabilitiesVersion = 1

// capabilities is what we add to our connect for peerkv peers: the data
// path we serve and, with a shared secret, proof that we know it.
func (t *Tier) capabilities() *protocol.Capabilities {
	c := &protocol.Capabilities{
		Version:       capabilitiesVersion,
		DataTransport: t.dt.Name(),
		DataAddr:      t.dt.DataAddr(),
		Nonce:         []byte{},
		Auth:          []byte{},
	}
	if t.cfg.AuthSecret != "" {
		c.Nonce = make([]byte, 16)
		_, _ = rand.Read(c.Nonce)
		c.Auth = connectProof(t.cfg.AuthSecret, t.env.LocalID, t.cfg.ConfigFingerprint, t.cfg.HashSeed, c)
	}
	return c
}

// connectProof binds the sender's identity, compatibility fields, data
// address and a fresh nonce to the shared secret.
func connectProof(secret, peerID, fingerprint, seed string, c *protocol.Capabilities) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	for _, f := range [][]byte{[]byte("peerkv-connect-v1"), []byte(peerID), []byte(fingerprint), []byte(seed),
		[]byte(c.DataTransport), []byte(c.DataAddr), c.Nonce} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		m.Write(n[:])
		m.Write(f)
	}
	return m.Sum(nil)
}

func (t *Tier) authenticate(c *protocol.Connect) error {
	if c.PeerKV == nil || len(c.PeerKV.Auth) == 0 {
		return errors.New("the peer sent no proof of the shared secret (a stock vLLM peer, or auth_secret unset there)")
	}
	if len(c.PeerKV.Nonce) < 16 {
		return errors.New("the peer's nonce is too short")
	}
	want := connectProof(t.cfg.AuthSecret, c.PeerID, c.ConfigFingerprint, c.HashSeed, c.PeerKV)
	if !hmac.Equal(want, c.PeerKV.Auth) {
		return errors.New("the peer's proof does not match our auth_secret")
	}
	return nil
}

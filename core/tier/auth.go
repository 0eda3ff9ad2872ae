package tier

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/peerkv/peerkv/core/protocol"
)

const capabilitiesVersion = 1

// authWindow bounds how old (or, with clock skew, how far ahead) an
// authenticated connect may be; nonces are remembered that long, so a
// captured connect cannot be replayed.
const authWindow = 2 * time.Minute

// maxRememberedNonces bounds the replay cache. Only connects carrying a
// valid proof enter it, so reaching it means a flood of genuine or replayed
// connects; further ones are refused until entries age out.
const maxRememberedNonces = 1 << 16

// capabilities is what we add to connect c for peerkv peers: the data paths
// we serve and, with a shared secret, proof that we know it.
func (t *Tier) capabilities(c *protocol.Connect) *protocol.Capabilities {
	caps := &protocol.Capabilities{
		Version:       capabilitiesVersion,
		DataTransport: t.dt.Name(),
		DataAddr:      t.dt.DataAddr(),
		Nonce:         []byte{},
		Auth:          []byte{},
	}
	if lp, ok := t.dt.(interface{ LocalProcess() string }); ok {
		caps.LocalProcess = lp.LocalProcess()
	}
	if t.cfg.AuthSecret != "" {
		caps.Nonce = make([]byte, 16)
		_, _ = rand.Read(caps.Nonce)
		caps.IssuedAtMs = uint64(t.now().UnixMilli())
		caps.Auth = connectProof(t.cfg.AuthSecret, c, caps)
	}
	return caps
}

// connectProof binds every field of the connect (identity, compatibility,
// NIXL metadata and region, data address), a fresh nonce and the issue time
// to the shared secret: a peer that knows it cannot be impersonated, and
// its connect cannot be altered (say, to point our writes at another NIXL
// agent).
func connectProof(secret string, c *protocol.Connect, caps *protocol.Capabilities) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	field := func(f []byte) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		m.Write(n[:])
		m.Write(f)
	}
	number := func(v uint64) {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], v)
		field(n[:])
	}
	field([]byte("peerkv-connect-v2"))
	field([]byte(c.PeerID))
	field([]byte(c.ConfigFingerprint))
	field([]byte(c.HashSeed))
	field(c.AgentMetadata)
	number(c.BaseAddr)
	number(c.NumBlocks)
	number(c.BlockLen)
	field([]byte(caps.DataTransport))
	field([]byte(caps.DataAddr))
	field([]byte(caps.LocalProcess))
	field(caps.Nonce)
	number(caps.IssuedAtMs)
	return m.Sum(nil)
}

func (t *Tier) authenticate(c *protocol.Connect) error {
	caps := c.PeerKV
	if caps == nil || len(caps.Auth) == 0 {
		return errors.New("the peer sent no proof of the shared secret (a stock vLLM peer, or auth_secret unset there)")
	}
	if len(caps.Nonce) < 16 {
		return errors.New("the peer's nonce is too short")
	}
	if !hmac.Equal(connectProof(t.cfg.AuthSecret, c, caps), caps.Auth) {
		return errors.New("the peer's proof does not match our auth_secret (or its connect was altered)")
	}
	return t.nonces.admit(caps.Nonce, caps.IssuedAtMs, t.now())
}

// nonceCache remembers the nonces of authenticated connects for authWindow.
type nonceCache struct {
	seen map[string]time.Time // nonce -> when it may be forgotten
}

// admit accepts a connect issued at issuedAtMs (Unix ms) once: it must be
// within authWindow of now, and its nonce new.
func (n *nonceCache) admit(nonce []byte, issuedAtMs uint64, now time.Time) error {
	for k, until := range n.seen {
		if now.After(until) {
			delete(n.seen, k)
		}
	}
	issued := time.UnixMilli(int64(issuedAtMs))
	if skew := now.Sub(issued); skew > authWindow || skew < -authWindow {
		return fmt.Errorf("the peer's connect was issued %v from our clock, beyond %v: a replay, or the clocks disagree",
			skew.Round(time.Second), authWindow)
	}
	if _, dup := n.seen[string(nonce)]; dup {
		return errors.New("the peer's connect is a replay (its nonce was already used)")
	}
	if len(n.seen) >= maxRememberedNonces {
		return fmt.Errorf("more than %d authenticated connects within %v; refusing until older ones age out",
			maxRememberedNonces, authWindow)
	}
	if n.seen == nil {
		n.seen = map[string]time.Time{}
	}
	n.seen[string(nonce)] = issued.Add(authWindow)
	return nil
}

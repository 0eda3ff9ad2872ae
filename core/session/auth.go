package session

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/peerkv/peerkv/core/protocol"
)

// capabilitiesVersion 2: per-session challenge nonces, peerkv_proof and
// peerkv_paths; revision 1's self-signed connects are gone (a captured one
// could be replayed to another node).
const capabilitiesVersion = 2

// nonceLen is the size of each session's challenge.
const nonceLen = 16

// Labels keep a proof from ever verifying as a paths MAC and vice versa.
const (
	proofLabel = "peerkv-proof-v3"
	pathsLabel = "peerkv-paths-v3"
)

func newNonce() []byte {
	n := make([]byte, nonceLen)
	_, _ = rand.Read(n) // never fails on Linux (Go 1.24+ crashes rather than return short)
	return n
}

// mac is HMAC-SHA256 over length-prefixed fields, so no two different field
// lists encode alike.
func mac(secret string, fields ...[]byte) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	for _, f := range fields {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		m.Write(n[:])
		m.Write(f)
	}
	return m.Sum(nil)
}

func number(v uint64) []byte {
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], v)
	return n[:]
}

// proof is what sender sends receiver: it covers both identities (so it
// cannot be reflected or relayed to a third node) and the receiver's
// challenge (so it cannot be replayed into another session).
func proof(secret, sender, receiver string, receiverNonce, senderNonce []byte) []byte {
	return mac(secret, []byte(proofLabel), []byte(sender), []byte(receiver), receiverNonce, senderNonce)
}

// pathsMAC binds the data-path fields to this session the same way.
func pathsMAC(secret, sender, receiver string, receiverNonce, senderNonce []byte, p *protocol.Paths) []byte {
	return mac(secret, []byte(pathsLabel), []byte(sender), []byte(receiver), receiverNonce, senderNonce,
		p.AgentMetadata, number(p.BaseAddr), number(p.NumBlocks), []byte(p.DataTransport), []byte(p.DataAddr),
		[]byte(p.SameHost), []byte(p.DataToken))
}

// peerNonce returns the challenge in the peer's connect.
func peerNonce(c *protocol.Connect) ([]byte, error) {
	if c.PeerKV == nil {
		return nil, errors.New("the peer sent no peerkv capabilities (a stock vLLM peer, which cannot authenticate)")
	}
	if c.PeerKV.Version < capabilitiesVersion {
		return nil, fmt.Errorf("the peer speaks peerkv capability revision %d; authentication needs %d (upgrade it)",
			c.PeerKV.Version, capabilitiesVersion)
	}
	if len(c.PeerKV.Nonce) < nonceLen {
		return nil, fmt.Errorf("the peer's challenge has %d bytes, want at least %d", len(c.PeerKV.Nonce), nonceLen)
	}
	return c.PeerKV.Nonce, nil
}

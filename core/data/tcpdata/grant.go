package tcpdata

import (
	"crypto/rand"
	"encoding/hex"

	"github.com/peerkv/peerkv/core/data"
)

// tokenBytes is the size of a session's data token.
const tokenBytes = 16

var _ data.Granter = (*Transport)(nil)

// Grant implements data.Granter: g.DataToken is a fresh key for peerID's
// data connections to us, replacing the one its previous session had. With
// Options.RequireGrant only a writer proving the current token of the peer
// id it names may write: the token travels only to that peer's address (or,
// with a secret, only to a peer that proved it), so no one else can write
// in its name, and its connections end with its session.
func (t *Transport) Grant(peerID string, g *data.Grants) {
	b := make([]byte, tokenBytes)
	_, _ = rand.Read(b)
	tok := hex.EncodeToString(b)
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	t.tokens[peerID] = tok
	g.DataToken = tok
}

// Revoke implements data.Granter: the session that held g ended, so its
// token no longer opens connections and those it opened are cut.
func (t *Transport) Revoke(peerID string, g data.Grants) {
	if g.DataToken == "" {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.tokens[peerID] == g.DataToken {
		delete(t.tokens, peerID)
	}
	for c, in := range t.inbound {
		if in.peerID == peerID && in.token == g.DataToken {
			_ = c.Close()
		}
	}
}

// writerKey is the key a writer's hello MACs use: the session's token (and
// the cluster secret with it, when one is set), else the secret alone.
func writerKey(secret, token string) string {
	if token == "" {
		return secret
	}
	return secret + "\x00peerkv-data-token\x00" + token
}

package tier

import (
	"crypto/rand"
	"encoding/binary"

	"github.com/peerkv/peerkv/core/protocol"
	"github.com/peerkv/peerkv/core/session"
)

// Restart fencing (docs/security.md, "Restarted peers"): a node names each
// start with a random epoch it sends in every connect. A connect under an
// identity we hold a session with, from a new start of that peer, ends the
// old session at once (its jobs reported failed once, its data-path state
// removed before the new session registers the peer) and opens a new one,
// on a fresh control connection: the old one leads to a process that is
// gone.

// newEpoch returns a random epoch, never 0 (0 is "none sent").
func newEpoch() uint64 {
	var b [8]byte
	for {
		_, _ = rand.Read(b[:]) // never fails (crypto/rand)
		if e := binary.LittleEndian.Uint64(b[:]); e != 0 {
			return e
		}
	}
}

// replaceRestarted ends s when m is a connect from a new start of its peer,
// and reports whether it did; the caller then opens the new session.
func (t *Tier) replaceRestarted(s *session.Session, m protocol.Message) bool {
	c, ok := m.(*protocol.Connect)
	if !ok {
		return false
	}
	restarted, why := s.Restarted(c)
	if !restarted {
		return false
	}
	id := s.PeerID()
	t.stats.peerRestarts++
	t.logf("WARNING", "peer %s: %s; ending its old session (its jobs fail) and opening a new one", id, why)
	// No goodbye: it would reach the new incarnation, and end its session.
	s.Close("the peer started anew: "+why, session.Dropped)
	t.settle() // reaps it: jobs reported, data path removed (before the new one's add), connection dropped
	t.peers.redial(id)
	return true
}

package tier

import (
	"sync/atomic"

	"github.com/peerkv/peerkv/core/session"
)

// identities is the set of peer ids that hold a session, readable without
// the tier's lock: the control pump drops a stranger's frame (any but a
// connect) and ignores a lost connection of one from it alone, so a flood
// from identities with no session never takes the lock host calls need
// (hostgate.go). Written only by peerSet, under the lock, copy on write:
// sessions open and end far less often than frames arrive, and at most
// max_peers ids are held.
type identities struct {
	set atomic.Pointer[map[string]struct{}]
}

// has says whether peerID held a session when the set was last published.
func (ids *identities) has(peerID string) bool {
	m := ids.set.Load()
	if m == nil {
		return false
	}
	_, ok := (*m)[peerID]
	return ok
}

// publish makes the ids of sessions the set.
func (ids *identities) publish(sessions map[string]*session.Session) { ids.publishWith(sessions, "") }

// publishWith makes the ids of sessions, and also (unless "") the id of
// a session about to open, the set.
func (ids *identities) publishWith(sessions map[string]*session.Session, also string) {
	m := make(map[string]struct{}, len(sessions)+1)
	for id := range sessions {
		m[id] = struct{}{}
	}
	if also != "" {
		m[also] = struct{}{}
	}
	ids.set.Store(&m)
}

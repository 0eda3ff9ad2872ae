package tier

import (
	"slices"
	"time"
)

// warmRedial is how often the keep_warm peers without a session are dialed
// again at most: an unreachable one is backed off on top (unreachable.go).
const warmRedial = time.Second

// keepWarm dials the keep_warm peers that hold no session, at most once per
// warmRedial: at start, and after a session with one ended. A refusal
// (allowed_peers, no free slot, the peer refusing our connect) is logged,
// rate-limited, and tried again at the next round; only an unreachable peer
// is backed off longer. t.mu held.
func (t *Tier) keepWarm(now time.Time) {
	if len(t.cfg.KeepWarm) == 0 || now.Before(t.peers.warmDue) {
		return
	}
	t.peers.warmDue = now.Add(warmRedial)
	for _, id := range t.cfg.KeepWarm {
		if t.peers.session(id) != nil {
			// Live, or ended and not reaped yet: a dial now would settle
			// first, and what that reap sets off may open a session to
			// the same peer, which the dial would then replace. The next
			// round finds it reaped.
			continue
		}
		if t.peers.backedOff(id) != nil {
			continue // its episode's line says why
		}
		if _, err := t.sessionFor(id); err != nil {
			t.logLimited("WARNING", "keep_warm peer %s: not dialed: %v", id, err)
		}
	}
}

// isWarm reports whether peerID is one of the keep_warm peers: the sessions
// we dialed to them are never evicted for being idle (one a peer opened
// under that id may be evicted: its id is only a claim).
func (p *peerSet) isWarm(peerID string) bool { return slices.Contains(p.cfg.KeepWarm, peerID) }

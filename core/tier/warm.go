package tier

import (
	"slices"
	"time"
)

// warmRedial is how often the keep_warm peers without a session are
// considered for a dial: a peer whose last dial ended before it was ready
// waits longer (warmBackoff), an unreachable one is backed off on top
// (unreachable.go).
const warmRedial = time.Second

// warmBackoffMax caps the wait before dialing a keep_warm peer that keeps
// refusing us (a secret or hash seed that differs, allowed_peers on its
// side, no free slot there): a misconfigured pair costs one connect and one
// refusal a minute, not one a second.
const warmBackoffMax = time.Minute

// warmDial is one keep_warm peer's dial streak.
type warmDial struct {
	dialing  bool      // a session we dialed has not been seen ready yet
	failures int       // dials in a row that ended before they were ready
	due      time.Time // no dial before then
}

// warmDials holds a streak per configured keep_warm peer: its keys come
// from the configuration only, never from the wire, so it never grows.
type warmDials map[string]*warmDial

func newWarmDials(ids []string) warmDials {
	w := make(warmDials, len(ids))
	for _, id := range ids {
		w[id] = &warmDial{}
	}
	return w
}

// seen records what a round found of a keep_warm peer's session: a ready
// one ends its streak of failures.
func (d *warmDial) seen(ready bool) {
	if ready {
		d.dialing, d.failures = false, 0
	}
}

// ended is called in a round that finds no session: a dial that never got
// ready counts as a failure and pushes the next dial back, doubling from
// warmRedial up to warmBackoffMax. It reports the wait when it set one.
func (d *warmDial) ended(now time.Time) time.Duration {
	if !d.dialing {
		return 0
	}
	d.dialing = false
	d.failures++
	wait := min(warmRedial<<min(d.failures, 6), warmBackoffMax)
	d.due = now.Add(wait)
	return wait
}

// keepWarm dials the keep_warm peers that hold no session, at most once per
// warmRedial: at start, and after a session with one ended. A refusal
// (allowed_peers, no free slot, the peer refusing our connect) is logged,
// rate-limited, and the peer backed off (warmDial); an unreachable peer is
// backed off by its episode. t.mu held.
func (t *Tier) keepWarm(now time.Time) {
	if len(t.cfg.KeepWarm) == 0 || now.Before(t.peers.warmDue) {
		return
	}
	t.peers.warmDue = now.Add(warmRedial)
	for _, id := range t.cfg.KeepWarm {
		w := t.peers.warm[id]
		if s := t.peers.session(id); s != nil {
			// Live, or ended and not reaped yet: a dial now would settle
			// first, and what that reap sets off may open a session to
			// the same peer, which the dial would then replace. The next
			// round finds it reaped.
			w.seen(s.Ready())
			continue
		}
		if wait := w.ended(now); wait > 0 {
			t.host.logLimited("WARNING", "keep_warm peer %s: %d dial(s) in a row ended before the session was ready; "+
				"dialing it again in %v (its refusal, logged above, says why)", id, w.failures, wait)
		}
		if now.Before(w.due) || t.peers.backedOff(id) != nil {
			continue // an unreachable one: its episode's line says why
		}
		if _, err := t.sessionFor(id); err != nil {
			t.host.logLimited("WARNING", "keep_warm peer %s: not dialed: %v", id, err)
			continue
		}
		w.dialing = true
	}
}

// isWarm reports whether peerID is one of the keep_warm peers: the sessions
// we dialed to them are never evicted for being idle (one a peer opened
// under that id may be evicted: its id is only a claim).
func (p *peerSet) isWarm(peerID string) bool { return slices.Contains(p.cfg.KeepWarm, peerID) }

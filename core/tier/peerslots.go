package tier

import (
	"fmt"
	"time"

	"github.com/peerkv/peerkv/core/protocol"
	"github.com/peerkv/peerkv/core/session"
)

// Session slots: max_peers in all, max_peers_per_host from one address, a
// share for handshakes that never finish, and who gives a slot up when a
// newcomer needs one (idle sessions, stalled handshakes, the most crowded
// network's least useful session: makeRoom in admission.go's terms).

// idleReapHeadroom: idle sessions are evicted only once this close to
// max_peers, so a quiet mesh is not torn down (vLLM's _IDLE_REAP_HEADROOM).
const idleReapHeadroom = 8

// handshakeGrace is how long a handshake may take before its slot can go to
// a newcomer when every slot is taken: real peers finish in milliseconds,
// so only connects that never complete (a flood) lose their slot.
const handshakeGrace = time.Second

// admit decides whether a connect from an unknown identity may open a
// session, making room if it can; "" admits it, else the reason not.
// addr is where the connection really comes from (the id is a claim), so
// one source cannot take every slot.
func (p *peerSet) admit(peerID, addr string) string {
	if peerID == p.env.LocalID {
		return "it claims our own id"
	}
	if !p.adm.allow.AllowsAddr(addr) {
		return whyNotAllowed
	}
	// An unknown address ("") is one source too.
	fromAddr, handshaking := 0, 0
	for _, s := range p.sessions {
		if s.Source() == addr {
			fromAddr++
		}
		if !s.Ready() && !s.Dialed() {
			handshaking++
		}
	}
	if fromAddr >= p.cfg.MaxPeersPerHost {
		return fmt.Sprintf("%d sessions from %q already (max_peers_per_host)", fromAddr, addr)
	}
	// Connects that never finish cannot take more than a share of the
	// slots: beyond it the oldest stalled one yields, or the newcomer waits.
	if limit := max(8, p.cfg.MaxPeers/4); handshaking >= limit {
		p.evictStalledHandshake(p.now(), fmt.Sprintf("%d handshakes are running (at most %d at once)", handshaking, limit))
		if n := p.countHandshaking(); n >= limit {
			return fmt.Sprintf("%d sessions are still handshaking (at most %d at once)", n, limit)
		}
	}
	if len(p.sessions) >= p.cfg.MaxPeers {
		p.evictIdle(p.now(), true)
	}
	if len(p.sessions) >= p.cfg.MaxPeers {
		p.evictStalledHandshake(p.now(), "every session slot is taken (max_peers)")
	}
	if len(p.sessions) >= p.cfg.MaxPeers {
		p.makeRoom(addr, false)
	}
	if len(p.sessions) >= p.cfg.MaxPeers {
		return fmt.Sprintf("%d sessions already (max_peers)", len(p.sessions))
	}
	return ""
}

// dial opens a session to peerID, which holds none live here, unless its
// back-off runs or no slot can be made; the caller checked allowed_peers.
func (p *peerSet) dial(peerID string) (*session.Session, error) {
	return p.dialWith(peerID, func() *session.Session { return session.New(p.env, peerID, "", true) })
}

// dialProbe is dial for a handshake-only probe (session.NewProbe, Tier.Probe).
func (p *peerSet) dialProbe(peerID string) (*session.Session, error) {
	return p.dialWith(peerID, func() *session.Session { return session.NewProbe(p.env, peerID) })
}

func (p *peerSet) dialWith(peerID string, newSession func() *session.Session) (*session.Session, error) {
	if err := p.backedOff(peerID); err != nil {
		return nil, err // before any session gives its slot up for the dial
	}
	if len(p.sessions) >= p.cfg.MaxPeers {
		p.evictIdle(p.now(), true)
	}
	if len(p.sessions) >= p.cfg.MaxPeers {
		p.makeRoom("", true)
	}
	if len(p.sessions) >= p.cfg.MaxPeers {
		return nil, fmt.Errorf("session limit reached (%d, option max_peers)", p.cfg.MaxPeers)
	}
	// Known before the dial: what the connection reports (an answer, its
	// failure) may reach the control goroutine before the session is held,
	// and must then wait for the lock, not be dropped as a stranger's.
	p.known.publishWith(p.sessions, peerID)
	if err := p.ctl.Connect(peerID); err != nil {
		p.known.publish(p.sessions)
		return nil, err
	}
	if p.refused.owes(peerID) {
		// A stock peer we refused inside the pace still waits for its
		// goodbye, which our session would otherwise cancel: it goes first.
		_ = p.send(peerID, &protocol.Disconnect{})
	}
	return p.add(peerID, newSession), nil
}

func (p *peerSet) countHandshaking() int {
	n := 0
	for _, s := range p.sessions {
		if !s.Ready() && !s.Dialed() {
			n++
		}
	}
	return n
}

// evictStalledHandshake frees the slot of the oldest session whose
// handshake has not finished after handshakeGrace.
func (p *peerSet) evictStalledHandshake(now time.Time, why string) {
	var oldest *session.Session
	for _, s := range p.sessions {
		// Sessions we dialed carry our own loads: never ours to give up.
		if s.Dead() || s.Ready() || s.Dialed() || now.Sub(s.OpenedAt()) < handshakeGrace {
			continue
		}
		if oldest == nil || s.OpenedAt().Before(oldest.OpenedAt()) {
			oldest = s
		}
	}
	if oldest != nil {
		oldest.Close(fmt.Sprintf("handshake unfinished after %v while %s", now.Sub(oldest.OpenedAt()).Round(time.Millisecond), why), session.Failure)
		oldest.Release()
		p.settle()
	}
}

// reapIdle ends every session idle for idle_timeout_s, once the sessions
// come within idleReapHeadroom of max_peers; the tick calls it.
func (p *peerSet) reapIdle(now time.Time) {
	if len(p.sessions) >= p.cfg.MaxPeers-min(idleReapHeadroom, p.cfg.MaxPeers-1) {
		p.evictIdle(now, false)
	}
}

// evictIdle ends sessions with no work and no traffic for idle_timeout_s
// (all of them, or only the longest idle one when a slot is needed now).
func (p *peerSet) evictIdle(now time.Time, one bool) {
	if p.cfg.IdleTimeout <= 0 {
		return
	}
	var oldest *session.Session
	for _, s := range p.sessions {
		if s.Dead() || s.HasPendingWork() || now.Sub(s.LastActivity()) < p.cfg.IdleTimeout || (s.Dialed() && p.isWarm(s.PeerID())) {
			continue
		}
		if !one {
			s.Close(fmt.Sprintf("idle for over %v", p.cfg.IdleTimeout), session.Orderly)
			s.Release()
			continue
		}
		if oldest == nil || s.LastActivity().Before(oldest.LastActivity()) {
			oldest = s
		}
	}
	if oldest != nil {
		oldest.Close(fmt.Sprintf("idle for over %v; its slot is needed", p.cfg.IdleTimeout), session.Orderly)
		oldest.Release()
	}
	p.settle()
}

// makeRoom frees a slot when every one is taken, by ending the least useful
// session that dialed us from the most crowded network, if that network
// holds more sessions than one address may (max_peers_per_host: a network
// within one address's quota never yields, so a stranger cannot churn a
// real cluster's sessions) and at least two more than the newcomer's (from
// addr; a peer we dial counts as a network of none), so the two never trade
// a slot back and forth. It reports whether a slot was freed.
func (p *peerSet) makeRoom(addr string, dialing bool) bool {
	counts := map[string]int{}
	for _, s := range p.sessions {
		if !s.Dead() && !s.Dialed() { // the sessions we dialed carry our own loads
			counts[networkOf(s.Source())]++
		}
	}
	mine := 0
	if !dialing {
		mine = counts[networkOf(addr)]
	}
	crowded, most := "", 0
	for n, c := range counts {
		if c > most || (c == most && n < crowded) {
			crowded, most = n, c
		}
	}
	if most <= p.cfg.MaxPeersPerHost || most < mine+2 {
		return false
	}
	var victim *session.Session
	quietSince := p.now().Add(-evictableQuiet)
	for _, s := range p.sessions {
		if s.Dead() || s.Dialed() || networkOf(s.Source()) != crowded {
			continue
		}
		// A session heard from just now is never the one to go (a
		// stranger's newcomer must not cut a pull under way); among the
		// rest, one with nothing in flight goes first (lessUseful).
		if s.LastActivity().After(quietSince) {
			continue
		}
		if victim == nil || lessUseful(s, victim) {
			victim = s
		}
	}
	if victim == nil {
		return false
	}
	p.counts.evicted++
	victim.Close(fmt.Sprintf("evicted: every session slot is taken (max_peers), %d by peers from %s, "+
		"and a peer from a less crowded network needs one", most, crowded), session.Orderly)
	victim.Release()
	p.settle()
	return true
}

// evictableQuiet: how long a session must have been quiet before makeRoom
// may end it for a newcomer.
const evictableQuiet = 250 * time.Millisecond

// lessUseful orders eviction candidates: one with nothing in flight before
// one with work, then the longest quiet first.
func lessUseful(a, b *session.Session) bool {
	if aw, bw := a.HasPendingWork(), b.HasPendingWork(); aw != bw {
		return bw
	}
	return a.LastActivity().Before(b.LastActivity())
}

// sayGoodbye tells a peer that holds no session here that it was refused.
func (p *peerSet) sayGoodbye(peerID string) {
	_ = p.send(peerID, &protocol.Disconnect{})
	p.ctl.Disconnect(peerID) // the goodbye lingers briefly, then the connection closes
}

// sayDueGoodbyes sends the paced goodbyes whose pace ended (refusals.go).
func (p *peerSet) sayDueGoodbyes(now time.Time) {
	for _, id := range p.refused.dueGoodbyes(now) {
		if s := p.sessions[id]; s == nil || s.Dead() { // a session opened since would end with it
			p.sayGoodbye(id)
		}
	}
}

// sayOwedGoodbyes says every goodbye still owed to a refused stock peer
// (at shutdown: no pace ends later) and returns how many.
func (p *peerSet) sayOwedGoodbyes() int {
	owed := p.refused.allOwed()
	for _, id := range owed {
		p.sayGoodbye(id)
	}
	return len(owed)
}

// quietRefusal reports whether a new connect of stock peer peerID is the
// one our goodbye drew, to be refused without one (refusals.go).
func (p *peerSet) quietRefusal(peerID string) bool { return p.refused.take(peerID, p.now()) }

// goodbyeNow reports whether a refusal of stock peer peerID says goodbye
// now; if not, the goodbye is owed until its pace ends.
func (p *peerSet) goodbyeNow(peerID string) bool { return p.refused.goodbyeNow(peerID, p.now()) }

// cancelGoodbye forgets a goodbye owed to peerID: a session opened with it,
// which the goodbye would end.
func (p *peerSet) cancelGoodbye(peerID string) { p.refused.owes(peerID) }

package tier

import (
	"fmt"
	"time"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/control"
	"github.com/peerkv/peerkv/core/protocol"
	"github.com/peerkv/peerkv/core/session"
)

// peerSet owns the sessions and everything kept per peer: which sessions
// are active, which ended, admission and slot eviction (peerslots.go),
// refusal pacing (refusals.go), unreachable back-off (unreachable.go),
// spelling checks (spelling.go), the data-path registry and the per-session
// path and per-peer entries. It is the only writer and deleter of these,
// and the only place a session ends: reap, closeAll and drop return the
// sessions they forgot, for the coordinator to purge from the other owners.
// Guarded by the tier's lock; it never calls back into the tier except
// through the funcs in peerDeps.
type peerSet struct {
	peerDeps
	sessions map[string]*session.Session
	// known mirrors the keys of sessions for readers without the lock
	// (identities.go); every write to sessions publishes it.
	known identities
	// active holds the sessions not Quiet: only they are ticked, flushed
	// and asked for pending work, so a step costs O(sessions in use), not
	// O(peers). A session joins when opened and when it takes on a request
	// (busy), and leaves when a tick finds it quiet or it ends.
	active map[*session.Session]struct{}
	// ended lists the sessions that reported their end, for reap.
	ended []*session.Session
	// paths is the data path each live session's peer was registered on,
	// so work is attributed to it even after the data path forgot it.
	paths map[*session.Session]string
	// stats is each live session's per-peer view (peerstats.go).
	stats map[*session.Session]*peerStats

	refused        refusals     // stock peers we dialed and refused lately (refusals.go)
	adm            admission    // allowed_peers and fair admission (admission.go)
	unreach        unreachable  // peers we could not connect to lately (unreachable.go)
	spellingChecks int          // name resolutions running (spelling.go)
	reg            *registry    // the data path's peer table (registry.go)
	counts         sessionCount // for Stats
	warmDue        time.Time    // when keepWarm may dial the keep_warm peers again (warm.go)
	warm           warmDials    // each keep_warm peer's dial streak (warm.go)
}

// sessionCount counts sessions over the tier's life.
type sessionCount struct {
	opened, closed, evicted int64
}

// peerLinks is what peerSet uses of the control transport; a transport may
// also be a control.Redialer and a control.Diagnoser.
type peerLinks interface {
	Connect(peerID string) error
	Disconnect(peerID string)
}

// peerDeps is what peerSet is given by the coordinator.
type peerDeps struct {
	cfg  config.Config
	env  *session.Env // new sessions run on it
	now  func() time.Time
	ctl  peerLinks
	logf Logf
	// peerInfo logs an INFO line about a session, rate-limited when the
	// peer dialed us.
	peerInfo func(s *session.Session, format string, args ...any)
	// send sends one message to a peer (a goodbye owed before our dial).
	send func(peerID string, m protocol.Message) error
	// settle applies what closing a session reported and reaps it, so a
	// slot freed by an eviction is free when the caller looks again.
	settle func()
	// onLoop has the progress loop run f under the lock: what a goroutine
	// found off the lock (a diagnosis, a resolved name).
	onLoop func(f func())
}

func newPeerSet(d peerDeps, adm admission, reg *registry) *peerSet {
	return &peerSet{
		peerDeps: d,
		sessions: map[string]*session.Session{},
		active:   map[*session.Session]struct{}{},
		paths:    map[*session.Session]string{},
		stats:    map[*session.Session]*peerStats{},
		adm:      adm,
		reg:      reg,
		warm:     newWarmDials(d.cfg.KeepWarm),
	}
}

// session is the session with peerID, or nil.
func (p *peerSet) session(peerID string) *session.Session { return p.sessions[peerID] }

// count is how many sessions are held (ended ones not yet reaped included).
func (p *peerSet) count() int { return len(p.sessions) }

// all iterates over every session held.
func (p *peerSet) all(yield func(*session.Session) bool) {
	for _, s := range p.sessions {
		if !yield(s) {
			return
		}
	}
}

// activeSessions iterates over the sessions not known to be quiet.
func (p *peerSet) activeSessions(yield func(*session.Session) bool) {
	for s := range p.active {
		if !yield(s) {
			return
		}
	}
}

// busy marks s active: it took on a request (session.Env.Busy).
func (p *peerSet) busy(s *session.Session) { p.active[s] = struct{}{} }

// tick runs the active sessions' deadlines; a session found quiet leaves
// the active set until it is busy again.
func (p *peerSet) tick(now time.Time) {
	for s := range p.active {
		s.Tick(now)
		if s.Quiet() {
			delete(p.active, s)
		}
	}
}

// endedSession notes that s reported its end (session.Ended): reap forgets it.
func (p *peerSet) endedSession(s *session.Session) { p.ended = append(p.ended, s) }

// open starts a session; source is the kernel-reported address of a peer
// that dialed us ("" for one we dial).
func (p *peerSet) open(peerID, source string, dialed bool) *session.Session {
	return p.add(peerID, func() *session.Session { return session.New(p.env, peerID, source, dialed) })
}

// add holds the session newSession opens in peerID's slot, ending the one
// there first: a new session may speak at once (ours dials with a connect).
func (p *peerSet) add(peerID string, newSession func() *session.Session) *session.Session {
	if old := p.sessions[peerID]; old != nil {
		// Never drop a session unclosed: its jobs would go unreported.
		old.Close("replaced by a new session", session.Orderly)
		old.Release()
		p.settle()
	}
	s := newSession()
	p.sessions[peerID] = s
	p.known.publish(p.sessions)
	p.stats[s] = &peerStats{PeerStats: PeerStats{Peer: peerID}, rtt: newHistogram(LookupRTTBuckets)}
	p.active[s] = struct{}{} // its handshake has a deadline
	p.counts.opened++
	p.logf("DEBUG", "session with %s opened", peerID) // its "data path" line (INFO) says it is up
	return s
}

// forget removes s from every map: the one place a session's entries go.
func (p *peerSet) forget(s *session.Session) {
	delete(p.sessions, s.PeerID()) // its callers publish p.known once for all they forget
	delete(p.active, s)
	delete(p.paths, s)
	delete(p.stats, s)
}

// reap closes the sessions that reported their end and forgets them,
// returning them for the other owners to purge; only the coordinator's
// teardown calls it, from settle, which then applies what Close reported.
func (p *peerSet) reap() []*session.Session {
	ended := p.ended
	p.ended = nil
	var gone []*session.Session
	for _, s := range ended {
		id := s.PeerID()
		if p.sessions[id] != s {
			continue // forgotten already
		}
		gone = append(gone, s)
		p.logEnd(s)
		p.refused.ended(s, p.now())
		s.Release()
		p.forget(s)
		p.reg.remove(id)
		if s.RejectCause() == session.CauseTimeout {
			// Never take this connection back: the handshake got no answer
			// on it (say, one the peer's ROUTER never reads).
			p.redial(id)
		} else {
			p.ctl.Disconnect(id)
		}
		p.counts.closed++
	}
	if len(gone) > 0 {
		p.known.publish(p.sessions)
	}
	return gone
}

// logEnd logs one line for an ended session, unless the session logged
// its own cause already (a rejection, a protocol error, a timeout).
func (p *peerSet) logEnd(s *session.Session) {
	id := s.PeerID()
	cause, unsure, unreached := s.ConnectFailed()
	switch {
	case unreached: // its episode's line says why
		if cause == "" {
			cause = control.CauseTimeout
		}
		p.connectFailed(id, cause, unsure, s.DeathReason())
	case s.DeathLogged():
	case s.Orderly():
		p.peerInfo(s, "peer %s: %s; session closed", id, s.DeathReason())
	default:
		p.logf("WARNING", "peer %s: %s; session closed", id, s.DeathReason())
	}
}

// closeAll closes every session with a goodbye (reason) and forgets it,
// returning them. The connections linger briefly, so the goodbyes go out
// before the transport closes.
func (p *peerSet) closeAll(reason string) []*session.Session {
	gone := make([]*session.Session, 0, len(p.sessions))
	for id, s := range p.sessions {
		s.Close(reason, session.Failure) // its goodbye: the peer logs an orderly end
		s.Release()
		p.forget(s)
		p.ctl.Disconnect(id)
		gone = append(gone, s)
	}
	p.known.publish(p.sessions)
	return gone
}

// drop forgets every session without closing it, returning them: for a
// poisoned tier, whose sessions' state is what may be broken.
func (p *peerSet) drop() []*session.Session {
	gone := make([]*session.Session, 0, len(p.sessions))
	for _, s := range p.sessions {
		gone = append(gone, s)
	}
	clear(p.sessions)
	p.known.publish(p.sessions)
	clear(p.active)
	clear(p.paths)
	clear(p.stats)
	p.ended = nil
	return gone
}

// redial drops our control connection to peerID so that the next send dials
// afresh (a connection that never completed a handshake, or one that leads
// to a peer's old incarnation, must not be taken back).
func (p *peerSet) redial(peerID string) {
	if r, ok := p.ctl.(control.Redialer); ok {
		r.Redial(peerID)
	}
}

// setPath records the data path s's peer was registered on; s is live.
func (p *peerSet) setPath(s *session.Session, name string) { p.paths[s] = name }

// pathOf is the data path s's peer uses (NoPath before registration).
func (p *peerSet) pathOf(s *session.Session) string {
	if name, ok := p.paths[s]; ok {
		return name
	}
	return NoPath
}

// entries iterates over the live sessions' per-peer entries.
func (p *peerSet) entries(yield func(*session.Session, *peerStats) bool) {
	for s, e := range p.stats {
		if !yield(s, e) {
			return
		}
	}
}

// statsOf is s's per-peer entry, nil once s is forgotten.
func (p *peerSet) statsOf(s *session.Session) *peerStats { return p.stats[s] }

// failed records what last went wrong with s's peer.
func (p *peerSet) failed(s *session.Session, format string, args ...any) {
	if e := p.stats[s]; e != nil {
		e.LastError, e.lastErrorAt = fmt.Sprintf(format, args...), p.now()
	}
}

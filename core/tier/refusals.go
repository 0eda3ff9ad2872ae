package tier

import (
	"time"

	"github.com/peerkv/peerkv/core/session"
)

// A stock vLLM peer opens a session for any frame from a peer it holds none
// with, and sends its connect at once; its own refusals send nothing. So a
// goodbye of ours that finds it without a session draws a new connect, and
// if we refuse that one with a goodbye too, the two ends trade connects and
// goodbyes every few milliseconds for as long as both run. Two refusals can
// start such an exchange, and this file holds what ends each:
//
//   - We dial a stock peer and refuse its connect (a hash seed, fingerprint
//     or block_len mismatch, no shared data path): the stock side has
//     dropped its session (it refused ours, or gives up), so our goodbye
//     draws a connect. That one connect, inside quietRefusalWindow, is
//     refused without a goodbye. Only a session we dialed arms this, and
//     the next refusal uses it up: a stock consumer that dials us is
//     refused with a goodbye every time, so each of its requests fails fast.
//   - We refuse a connect before any session opens (max_peers, the per-host
//     or handshake caps) while a goodbye of ours has found the stock peer
//     without a session. Staying silent is no cure here: a stock consumer
//     waits for the ack with no deadline, so a silent refusal would hang its
//     request. Instead the goodbyes to one stock peer are paced: the first
//     goes at once, one asked for within goodbyePace of the last is sent at
//     the end of the pace. An exchange runs at most a few times a second, and
//     a stock consumer's request still falls back within goodbyePace.
const (
	// quietRefusalWindow is well above one exchange (milliseconds) and lets
	// an armed entry that drew nothing lapse.
	quietRefusalWindow = 2 * time.Second
	// goodbyePace is the least time between two goodbyes to one stock peer
	// refused before its session opened.
	goodbyePace = 250 * time.Millisecond
)

// maxRefusedPeers bounds the stock peers remembered. Beyond it a refusal
// is as if the peer were unknown: quiet arming stops, goodbyes go at once.
const maxRefusedPeers = 1024

// refusedPeer is one stock peer refused lately. It ends when neither its
// quiet window nor its pace holds anything.
type refusedPeer struct {
	quietUntil  time.Time // the next connect before this is the one our goodbye drew
	lastGoodbye time.Time // when a goodbye of a refusal before any session last went
	goodbyeDue  bool      // one more such goodbye goes at lastGoodbye + goodbyePace
}

// refusals holds the stock peers refused lately; the tier owns it, under
// t.mu.
type refusals struct {
	peers map[string]*refusedPeer
}

// entry returns peerID's record, making one if there is room.
func (r *refusals) entry(peerID string) *refusedPeer {
	if e := r.peers[peerID]; e != nil {
		return e
	}
	if len(r.peers) >= maxRefusedPeers {
		return nil
	}
	if r.peers == nil {
		r.peers = map[string]*refusedPeer{}
	}
	e := &refusedPeer{}
	r.peers[peerID] = e
	return e
}

// ended arms the quiet refusal if s was a stock peer we dialed and refused.
func (r *refusals) ended(s *session.Session, now time.Time) {
	if !s.Dialed() {
		return
	}
	seen, ok := s.Seen()
	if !ok || seen.PeerKV {
		return
	}
	switch s.RejectCause() {
	case session.CauseBlockLen, session.CauseFingerprint, session.CauseHashSeed,
		session.CauseIdentity, session.CauseAuth, session.CauseDataPath:
	default:
		return // not refused by us (or refused by the peer, which sends no new session)
	}
	if e := r.entry(s.PeerID()); e != nil {
		e.quietUntil = now.Add(quietRefusalWindow)
	}
}

// take reports whether a new connect of stock peer peerID is the one our
// goodbye drew, and uses the quiet refusal up.
func (r *refusals) take(peerID string, now time.Time) bool {
	e := r.peers[peerID]
	if e == nil || e.quietUntil.IsZero() {
		return false
	}
	quiet := now.Before(e.quietUntil)
	e.quietUntil = time.Time{}
	return quiet
}

// goodbyeNow reports whether a refusal of stock peer peerID before any
// session opened says goodbye now; if not, the goodbye is owed and
// dueGoodbyes hands it out at the end of the pace.
func (r *refusals) goodbyeNow(peerID string, now time.Time) bool {
	e := r.entry(peerID)
	if e == nil {
		return true
	}
	if e.lastGoodbye.IsZero() || now.Sub(e.lastGoodbye) >= goodbyePace {
		e.lastGoodbye, e.goodbyeDue = now, false
		return true
	}
	e.goodbyeDue = true
	return false
}

// opened drops an owed goodbye: peerID has a session now, which that
// goodbye would end.
func (r *refusals) opened(peerID string) {
	if e := r.peers[peerID]; e != nil {
		e.goodbyeDue = false
	}
}

// dueGoodbyes returns the peers whose owed goodbye goes now, marking it
// sent, and drops the records that hold nothing any more.
func (r *refusals) dueGoodbyes(now time.Time) []string {
	var due []string
	for id, e := range r.peers {
		paced := now.Sub(e.lastGoodbye) < goodbyePace
		if e.goodbyeDue && !paced {
			due = append(due, id)
			e.lastGoodbye, e.goodbyeDue, paced = now, false, true
		}
		if !e.goodbyeDue && !paced && !now.Before(e.quietUntil) {
			delete(r.peers, id)
		}
	}
	return due
}

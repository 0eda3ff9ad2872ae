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
//   - We refuse a stock peer that dialed us (before any session opens:
//     max_peers, the per-host or handshake caps; or in its handshake: a
//     field mismatch, auth_secret) while a goodbye of ours has found it
//     without a session. Staying silent is no cure here: a stock consumer
//     waits for the ack with no deadline, so a silent refusal would hang its
//     request. Instead the goodbyes to one stock peer are paced: the first
//     goes at once, one asked for within goodbyePace of the last is sent at
//     the end of the pace (or before a dial of ours, or at shutdown). An
//     exchange runs at most a few times a second, and a stock consumer's
//     request still falls back within goodbyePace.
const (
	// quietRefusalWindow is well above one exchange (milliseconds) and lets
	// an armed entry that drew nothing lapse.
	quietRefusalWindow = 2 * time.Second
	// goodbyePace is the least time between two goodbyes refusing one
	// stock peer that dialed us.
	goodbyePace = 250 * time.Millisecond
)

// maxQuietRefusals bounds the quiet arms. Only sessions we dialed (peers
// named by our own requests) add one, so a stranger cannot fill it.
const maxQuietRefusals = 1024

// maxPacedPeers bounds the pace records. Anyone can add one (a refused
// connect under a made-up id), so a full table makes room by dropping a
// record that owes nothing; only if every record owes a goodbye does a
// refusal say goodbye at once, as with no pacing. Keeping it full takes
// several connects a second under each of thousands of ids.
const maxPacedPeers = 4096

// pace is one stock peer's goodbyes for refusals of its connects. It ends
// when it owes nothing and the pace has passed.
type pace struct {
	last time.Time // when the last goodbye went
	owed bool      // one more goes at last + goodbyePace
}

// refusals holds the stock peers refused lately; peerSet owns it.
type refusals struct {
	quiet map[string]time.Time // dialed stock peers we refused: the connect our goodbye draws before then is refused silently
	paced map[string]*pace
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
	if r.quiet == nil {
		r.quiet = map[string]time.Time{}
	}
	if _, known := r.quiet[s.PeerID()]; !known && len(r.quiet) >= maxQuietRefusals {
		return
	}
	r.quiet[s.PeerID()] = now.Add(quietRefusalWindow)
}

// take reports whether a new connect of stock peer peerID is the one our
// goodbye drew, and uses the quiet refusal up.
func (r *refusals) take(peerID string, now time.Time) bool {
	until, ok := r.quiet[peerID]
	if !ok {
		return false
	}
	delete(r.quiet, peerID)
	return now.Before(until)
}

// goodbyeNow reports whether a refusal of stock peer peerID says goodbye
// now; if not, the goodbye is owed and dueGoodbyes hands it out at the end
// of the pace.
func (r *refusals) goodbyeNow(peerID string, now time.Time) bool {
	p := r.pace(peerID)
	if p == nil {
		return true
	}
	if p.last.IsZero() || now.Sub(p.last) >= goodbyePace {
		p.last, p.owed = now, false
		return true
	}
	p.owed = true
	return false
}

// pace returns peerID's record, making one if there is room or a record
// that owes nothing can give its place.
func (r *refusals) pace(peerID string) *pace {
	if p := r.paced[peerID]; p != nil {
		return p
	}
	if r.paced == nil {
		r.paced = map[string]*pace{}
	}
	if len(r.paced) >= maxPacedPeers {
		for id, p := range r.paced {
			if !p.owed {
				delete(r.paced, id)
				break
			}
		}
		if len(r.paced) >= maxPacedPeers {
			return nil
		}
	}
	p := &pace{}
	r.paced[peerID] = p
	return p
}

// owes reports whether a goodbye to peerID is owed, and forgets it: the
// caller sends it now, or a session opened that it would end.
func (r *refusals) owes(peerID string) bool {
	p := r.paced[peerID]
	if p == nil || !p.owed {
		return false
	}
	p.owed = false
	return true
}

// allOwed returns every peer owed a goodbye, forgetting the debts.
func (r *refusals) allOwed() []string {
	var ids []string
	for id := range r.paced {
		if r.owes(id) {
			ids = append(ids, id)
		}
	}
	return ids
}

// dueGoodbyes returns the peers whose owed goodbye goes now, marking it
// sent, and drops what has lapsed.
func (r *refusals) dueGoodbyes(now time.Time) []string {
	var due []string
	for id, p := range r.paced {
		if now.Sub(p.last) < goodbyePace {
			continue
		}
		if p.owed {
			due = append(due, id)
			p.last, p.owed = now, false
			continue
		}
		delete(r.paced, id)
	}
	for id, until := range r.quiet {
		if !now.Before(until) {
			delete(r.quiet, id)
		}
	}
	return due
}

package tier

import (
	"time"

	"github.com/peerkv/peerkv/core/session"
)

// quietRefusalWindow is how long the one connect our goodbye may draw from
// a stock vLLM peer is refused without a goodbye.
//
// A stock peer opens a session for any frame from a peer it holds none
// with, and sends its connect at once; its own refusals send nothing. So
// when we dial a stock peer and refuse its connect (a hash seed,
// fingerprint or block_len mismatch, no shared data path), the stock side
// has dropped its session (it refused ours, or gives up), our goodbye opens
// a new one there, and its connect arrives here as a new session. Refused
// with a goodbye again, the two ends traded connects and goodbyes every few
// milliseconds for as long as both ran. That drawn connect is now refused
// silently, and the exchange ends. Only a session we dialed arms this, and
// the next refusal uses it up: a stock consumer that dials us is refused
// with a goodbye every time, so each of its requests fails fast. The window
// is well above one exchange (milliseconds) and lets an armed entry that
// drew nothing lapse.
const quietRefusalWindow = 2 * time.Second

// maxQuietRefusals bounds the peers remembered. Only sessions we dialed
// (peers named by our own requests) add one, so a stranger cannot fill it.
const maxQuietRefusals = 1024

// refusals holds the stock peers we dialed and refused lately; the tier
// owns it, under t.mu. An entry ends when a refusal uses it or its window
// passes.
type refusals struct {
	until map[string]time.Time
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
	if r.until == nil {
		r.until = map[string]time.Time{}
	}
	if _, known := r.until[s.PeerID()]; !known && len(r.until) >= maxQuietRefusals {
		return
	}
	r.until[s.PeerID()] = now.Add(quietRefusalWindow)
}

// take reports whether a new session of peerID is the one our goodbye
// drew, and uses the entry up.
func (r *refusals) take(peerID string, now time.Time) bool {
	until, ok := r.until[peerID]
	if !ok {
		return false
	}
	delete(r.until, peerID)
	return now.Before(until)
}

// expire drops the entries past their window.
func (r *refusals) expire(now time.Time) {
	for id, until := range r.until {
		if !now.Before(until) {
			delete(r.until, id)
		}
	}
}

package tier

import (
	"errors"
	"fmt"
	"time"

	"github.com/peerkv/peerkv/core/control"
)

// A peer we dial and cannot reach (nothing listens, no route, a name that
// does not resolve, packets dropped until the handshake times out) starts
// an episode: the peer is not dialed again for a short back-off, so a new
// request to it gets MISS at once instead of waiting on a fresh dial;
// the cause is logged once for the episode, in words, and each failed
// connect is counted by cause (peer_connect_failures). A connect libzmq can
// only guess the cause of is diagnosed (control.Diagnoser) off the lock.
// The episode ends when the peer is heard from (its connect, to our dial or
// its own) or, with no new failure, when it expires.
const (
	// FirstConnectBackoff is the first back-off; each failure in an episode
	// doubles it up to backoffMax, well inside handshake_timeout_s / 4 so a
	// peer that comes back is dialed again soon.
	FirstConnectBackoff = time.Second
	backoffMax          = 5 * time.Second
	// maxUnreachable bounds the episodes kept. Only peers our own requests
	// name start one; at the bound the one whose back-off ended first goes.
	maxUnreachable = 1024
	// diagnoseTimeout bounds one diagnosis; maxDiagnoses how many run at once.
	diagnoseTimeout = 5 * time.Second
	maxDiagnoses    = 8
)

// errUnreachable marks a source not dialed during its back-off.
var errUnreachable = errors.New("not dialing it during its back-off")

// episode is one peer's run of failed connects.
type episode struct {
	since, last time.Time
	until       time.Time // not dialed before this
	backoff     time.Duration
	failures    int
	cause       string // known once the transport or a diagnosis named it
	detail      string
	guess       string // the transport's guess, used when a diagnosis finds it reachable
	uncounted   int    // failures waiting for the cause to be counted
	diagnosing  bool
}

// unreachable holds the episodes; peerSet owns it.
type unreachable struct {
	peers      map[string]*episode
	diagnosing int
	counts     map[string]int64 // failed connects by cause
}

type diagnosis struct {
	peerID, cause, detail string
}

// connectFailed records that a session we dialed never reached peerID.
// cause is the transport's ("" when it could not tell), sure unless unsure.
func (p *peerSet) connectFailed(peerID, cause string, unsure bool, reason string) {
	u := &p.unreach
	if u.peers == nil {
		u.peers, u.counts = map[string]*episode{}, map[string]int64{}
	}
	now := p.now()
	ep := u.peers[peerID]
	if ep == nil {
		u.makeRoom()
		ep = &episode{since: now, backoff: FirstConnectBackoff}
		u.peers[peerID] = ep
	} else {
		ep.backoff = min(2*ep.backoff, backoffMax)
	}
	ep.failures++
	ep.last, ep.until = now, now.Add(ep.backoff)
	if ep.cause != "" {
		u.counts[ep.cause]++
		return
	}
	ep.uncounted++
	ep.guess, ep.detail = cause, reason
	d, canDiagnose := p.ctl.(control.Diagnoser)
	if !unsure || !canDiagnose || u.diagnosing >= maxDiagnoses {
		p.nameEpisode(peerID, ep, cause, reason)
		return
	}
	if ep.diagnosing {
		return
	}
	ep.diagnosing = true
	u.diagnosing++
	go func() {
		c, detail := d.Diagnose(peerID, diagnoseTimeout)
		p.onLoop(func() { p.diagnosed(diagnosis{peerID: peerID, cause: c, detail: detail}) })
	}()
}

// onLoop has the progress loop run f under t.mu: what a goroutine found
// off the lock (a diagnosis, a name resolved). Dropped at shutdown.
func (t *Tier) onLoop(f func()) { t.intake.toLoop(f, t.life.stop) }

// diagnosed applies a diagnosis; on the loop, under the tier's lock.
func (p *peerSet) diagnosed(d diagnosis) {
	u := &p.unreach
	u.diagnosing--
	ep := u.peers[d.peerID]
	if ep == nil || !ep.diagnosing {
		return // heard from meanwhile: the episode is over
	}
	ep.diagnosing = false
	// The back-off the log line promises counts from now: diagnosing dropped
	// packets takes diagnoseTimeout, longer than the first back-off.
	if until := p.now().Add(ep.backoff); until.After(ep.until) {
		ep.until = until
	}
	cause, detail := d.cause, d.detail
	if cause == "" { // reachable now: the transport's guess, in its words
		cause, detail = ep.guess, ep.detail+" (a TCP connection to it opens now: it may have just started, "+
			"or it accepts connections but never answers, e.g. a frozen process or not a peerkv/vLLM port)"
	}
	p.nameEpisode(d.peerID, ep, cause, detail)
}

// nameEpisode settles the episode's cause, counts its failures and logs its
// one line.
func (p *peerSet) nameEpisode(peerID string, ep *episode, cause, detail string) {
	ep.cause, ep.detail = cause, detail
	p.unreach.counts[cause] += int64(ep.uncounted)
	ep.uncounted = 0
	p.logf("WARNING", "cannot connect to peer %s (%s): %s; its requests are served locally, and it is not dialed "+
		"again for %v (back-off doubling up to %v; a connect from it ends the back-off)",
		peerID, cause, detail, ep.backoff, backoffMax)
}

// backedOff says why peerID is not to be dialed now, or nil.
func (p *peerSet) backedOff(peerID string) error {
	ep := p.unreach.peers[peerID]
	now := p.now()
	if ep == nil || !now.Before(ep.until) {
		return nil
	}
	cause := ep.cause
	if cause == "" {
		cause = "being diagnosed"
	}
	return fmt.Errorf("%w: %d connect(s) to it failed in the last %v (%s); next dial in %v",
		errUnreachable, ep.failures, now.Sub(ep.since).Round(time.Millisecond), cause, ep.until.Sub(now).Round(time.Millisecond))
}

// naming reports whether peerID's episode waits for its diagnosis.
func (u *unreachable) naming(peerID string) bool {
	ep := u.peers[peerID]
	return ep != nil && ep.cause == ""
}

// why says why peerID cannot be reached, in words ("" if it is not known
// to be unreachable).
func (u *unreachable) why(peerID string) string {
	ep := u.peers[peerID]
	if ep == nil || ep.cause == "" {
		return ""
	}
	return fmt.Sprintf("cannot connect (%s): %s", ep.cause, ep.detail)
}

// heardFrom ends peerID's episode: it connected (to our dial or its own).
func (p *peerSet) heardFrom(peerID string) {
	ep := p.unreach.peers[peerID]
	if ep == nil {
		return
	}
	delete(p.unreach.peers, peerID)
	if ep.uncounted > 0 && ep.guess != "" {
		p.unreach.counts[ep.guess] += int64(ep.uncounted)
	}
	p.logf("INFO", "peer %s is reachable again, %v after the first of %d failed connect(s)",
		peerID, p.now().Sub(ep.since).Round(time.Millisecond), ep.failures)
}

// expireEpisodes forgets episodes with no failure for long enough that a
// dial after their back-off would have failed again by now.
func (p *peerSet) expireEpisodes(now time.Time) {
	for id, ep := range p.unreach.peers {
		if !ep.diagnosing && now.Sub(ep.until) > p.cfg.HandshakeTimeout+backoffMax {
			delete(p.unreach.peers, id)
		}
	}
}

// makeRoom drops, at the bound, the episode whose back-off ended first.
func (u *unreachable) makeRoom() {
	if len(u.peers) < maxUnreachable {
		return
	}
	oldest := ""
	for id, ep := range u.peers {
		if !ep.diagnosing && (oldest == "" || ep.until.Before(u.peers[oldest].until)) {
			oldest = id
		}
	}
	delete(u.peers, oldest)
}

// connectFailureCounts copies the counts for Stats.
func (u *unreachable) connectFailureCounts() map[string]int64 {
	out := make(map[string]int64, len(u.counts))
	for c, n := range u.counts {
		out[c] = n
	}
	return out
}

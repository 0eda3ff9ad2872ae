package tier

import (
	"math"
	"slices"
	"time"

	"github.com/peerkv/peerkv/core/session"
)

// Link telemetry per peer: what a router needs to price a pull from it.
// Kept in the peer's entry (peerstats.go), so it lives and dies with the
// session and is bounded by max_peers times these fixed windows.

// rttWindow is how many recent control round trips p50/p99 are taken from.
const rttWindow = 128

// Link failure causes: the fixed label values of a peer's failures.
const (
	// FailTransfer: a fetch the peer could not supply (it reported a
	// failed transfer, or its rows did not come).
	FailTransfer = "transfer"
	// FailAborted: a fetch aborted here (load deadline, or cancelled).
	FailAborted = "aborted"
	// FailBadFrame: a control frame from the peer that did not decode.
	FailBadFrame = "bad_frame"
)

// LinkFailureCauses are every cause a link entry counts (an array: a new
// cause resizes the counters with it).
var LinkFailureCauses = [...]string{FailTransfer, FailAborted, FailBadFrame}

// LinkStats is one peer's link, as each "peers" entry's "link" lists it.
type LinkStats struct {
	// RTTP50 and RTTP99 are quantiles of the newest RTTSamples control
	// round trips (our lookups, sent to first answer), seconds.
	RTTP50     float64 `json:"rtt_p50_s"`
	RTTP99     float64 `json:"rtt_p99_s"`
	RTTSamples int     `json:"rtt_samples"`
	// SetupS is the session's setup: opened (our dial, or their connect)
	// until the handshake finished, data path registered (0: not yet).
	SetupS float64 `json:"setup_s"`
	PullModel
	// Failures counts what failed with this peer, by LinkFailureCauses.
	Failures map[string]int64 `json:"failures"`
}

// link is the live state behind a LinkStats; guarded by t.mu.
type link struct {
	rtt      [rttWindow]float64
	rttN     int
	rttNext  int
	setup    time.Duration
	fit      pullFit
	failures [len(LinkFailureCauses)]int64 // by LinkFailureCauses' order
}

func (l *link) observeRTT(d time.Duration) {
	l.rtt[l.rttNext] = d.Seconds()
	l.rttNext = (l.rttNext + 1) % rttWindow
	l.rttN = min(l.rttN+1, rttWindow)
}

func (l *link) failed(cause string) {
	if i := slices.Index(LinkFailureCauses[:], cause); i >= 0 {
		l.failures[i]++
	}
}

func (l *link) snapshot(now time.Time) LinkStats {
	v := LinkStats{RTTSamples: l.rttN, SetupS: l.setup.Seconds(), PullModel: l.fit.model(now),
		Failures: make(map[string]int64, len(LinkFailureCauses))}
	for i, c := range LinkFailureCauses {
		v.Failures[c] = l.failures[i]
	}
	if l.rttN > 0 {
		sorted := slices.Clone(l.rtt[:l.rttN])
		slices.Sort(sorted)
		v.RTTP50, v.RTTP99 = quantile(sorted, 0.50), quantile(sorted, 0.99)
	}
	return v
}

// quantile is the nearest-rank q-quantile of sorted (not empty).
func quantile(sorted []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// setUp records s's setup time in its peer's entry the first time it is
// found handshaked. Called after each frame and registration.
func (p *peerSet) setUp(s *session.Session) {
	if e := p.statsOf(s); e != nil && e.link.setup == 0 && s.Ready() {
		e.link.setup = max(p.now().Sub(s.OpenedAt()), time.Nanosecond)
	}
}

// fetched feeds one completed fetch from s's peer to its pull model:
// bytes landed, sent until its report.
func (p *peerSet) fetched(s *session.Session, bytes int64, took time.Duration) {
	if e := p.statsOf(s); e != nil {
		e.link.fit.add(p.now(), bytes, took)
	}
}

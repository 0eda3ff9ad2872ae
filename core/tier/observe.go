package tier

import (
	"sort"
	"time"

	"github.com/peerkv/peerkv/core/control"
	"github.com/peerkv/peerkv/core/session"
)

// What an operator watches besides the plain counters: handshake
// rejections by cause, loads and bytes by data path, fallbacks to a slower
// path, and latency histograms. Every label has a fixed, small set of
// values (causes, path names, ok/failed): nothing is labelled per request.
// The per-peer view (peerstats.go) lists live sessions only.

// Histogram bucket upper bounds, in seconds. The Python package declares
// the same buckets to vLLM (exported through core/contract).
var (
	LookupRTTBuckets   = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}
	LoadSecondsBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}
)

// RejectionCauses are the label values of handshake rejections:
// session.Cause* for sessions refused in their handshake, and "limit" for
// connects refused before a session opened (max_peers, max_peers_per_host,
// the handshaking share, a peer claiming our id), and "not_allowed" for
// peers outside allowed_peers (dials not attempted, connects refused).
var RejectionCauses = append(append([]string(nil), session.RejectionCauses...), CauseLimit, CauseNotAllowed)

// CauseLimit: a connect refused before a session opened.
const CauseLimit = "limit"

// NoPath labels work with a peer whose data path was never registered.
const NoPath = "none"

// Histogram is a snapshot: Counts[i] observations fell in (LE[i-1], LE[i]]
// (the last one above every bound) and summed to Sums[i]. Per-bucket sums
// let a host replay the observations exactly enough for Prometheus: each
// bucket's count and the total sum are exact.
type Histogram struct {
	LE     []float64 `json:"le"`
	Counts []int64   `json:"counts"`
	Sums   []float64 `json:"sums"`
}

type histogram struct {
	bounds []float64
	counts []int64
	sums   []float64
}

func newHistogram(bounds []float64) *histogram {
	return &histogram{bounds: bounds, counts: make([]int64, len(bounds)+1), sums: make([]float64, len(bounds)+1)}
}

func (h *histogram) observe(v float64) {
	i := sort.SearchFloat64s(h.bounds, v) // the first bound >= v: Prometheus' "le"
	h.counts[i]++
	h.sums[i] += v
}

func (h *histogram) snapshot() Histogram {
	return Histogram{LE: h.bounds, Counts: append([]int64(nil), h.counts...), Sums: append([]float64(nil), h.sums...)}
}

// PathStats counts what moved over one data path.
type PathStats struct {
	// Loads and LoadFailures count fetch rounds pulled from peers on this
	// path (a load spread over sources has one per source).
	Loads        int64 `json:"loads"`
	LoadFailures int64 `json:"load_failures"`
	BytesIn      int64 `json:"bytes_in"`
	// Stores counts store and pin jobs whose rows a peer fetched on this
	// path; BytesOut their bytes.
	Stores   int64 `json:"stores"`
	BytesOut int64 `json:"bytes_out"`
	// Fallbacks counts peers served on this path although they offered a
	// faster one that failed to register (its reason is in the log).
	Fallbacks int64 `json:"fallbacks"`
	// IntegrityFailures counts fetch rounds on this path whose rows failed
	// the verified-pull check (also in LoadFailures).
	IntegrityFailures int64 `json:"integrity_failures"`
}

// observations holds the by-cause and by-path counters and histograms;
// guarded by t.mu like counters.
type observations struct {
	rejections map[string]int64
	paths      map[string]*PathStats
	lookupRTT  *histogram
	// lookupServed: peers' lookups held here, arrival to answer sent (what
	// this producer adds to their lookup_rtt_s).
	lookupServed *histogram
	loadOK       *histogram
	loadFailed   *histogram
	// sessionPath is the data path each live session's peer was registered
	// on, so work is attributed to it even after the data path forgot it.
	sessionPath map[*session.Session]string
	// peers is each live session's per-peer view (peerstats.go).
	peers map[*session.Session]*peerStats
	// peersDelivered: when the host last got the per-peer list (HostStats).
	peersDelivered time.Time
}

func newObservations() observations {
	return observations{
		rejections:   map[string]int64{},
		paths:        map[string]*PathStats{},
		lookupRTT:    newHistogram(LookupRTTBuckets),
		lookupServed: newHistogram(LookupRTTBuckets),
		loadOK:       newHistogram(LoadSecondsBuckets),
		loadFailed:   newHistogram(LoadSecondsBuckets),
		sessionPath:  map[*session.Session]string{},
		peers:        map[*session.Session]*peerStats{},
	}
}

func (o *observations) path(name string) *PathStats {
	p := o.paths[name]
	if p == nil {
		p = &PathStats{}
		o.paths[name] = p
	}
	return p
}

// pathOf is the data path s's peer uses (NoPath before registration).
func (o *observations) pathOf(s *session.Session) string {
	if p, ok := o.sessionPath[s]; ok {
		return p
	}
	return NoPath
}

// observeReport attributes a session's report to its data path; called by
// apply, with t.mu held.
func (t *Tier) observeReport(r session.Report) {
	t.observePeerReport(r)
	switch r.Kind {
	case session.LoadDone:
		p := t.obs.path(t.obs.pathOf(r.Session))
		if r.OK {
			p.Loads++
			p.BytesIn += int64(len(r.Rows)) * int64(t.region.RowLen)
		} else {
			p.LoadFailures++
		}
	case session.StoreDone:
		if r.OK && r.Bytes > 0 {
			p := t.obs.path(t.obs.pathOf(r.Session))
			p.Stores++
			p.BytesOut += r.Bytes
		}
	}
}

// observeRegistered records the path a peer was registered on, counting a
// fallback when faster paths it offered failed; t.mu held.
func (t *Tier) observeRegistered(s *session.Session) {
	if s.Dead() {
		return
	}
	name, refused := t.dt.Name(), ""
	if m, ok := t.dt.(interface {
		PathTo(string) string
		Refused(string) string
	}); ok {
		name, refused = m.PathTo(s.PeerID()), m.Refused(s.PeerID())
	}
	if name == "" {
		name = NoPath
	}
	t.obs.sessionPath[s] = name
	if refused != "" {
		t.obs.path(name).Fallbacks++
		t.obs.peerFailed(s, t.now(), "data path %s; not faster ones: %s", name, refused)
	}
}

// observeEnded counts how a reaped session ended; t.mu held.
func (t *Tier) observeEnded(s *session.Session) {
	delete(t.obs.sessionPath, s)
	delete(t.obs.peers, s)
	if c := s.RejectCause(); c != "" && !s.Probe() { // a probe's refusal is the answer it asked for
		t.obs.rejections[c]++
	}
}

// observeLoad records a load's time from submission to its report.
func (t *Tier) observeLoad(ok bool, d time.Duration) {
	if ok {
		t.obs.loadOK.observe(d.Seconds())
	} else {
		t.obs.loadFailed.observe(d.Seconds())
	}
}

// observeSnapshot fills the by-cause and by-path parts of a Stats; t.mu held.
func (t *Tier) observeSnapshot(st *Stats) {
	st.HandshakeRejections = make(map[string]int64, len(t.obs.rejections))
	for c, n := range t.obs.rejections {
		st.HandshakeRejections[c] = n
	}
	if t.adm.atAccept != nil {
		if n := t.adm.atAccept(); n > 0 {
			st.HandshakeRejections[CauseNotAllowed] += int64(n)
		}
	}
	st.Paths = make(map[string]PathStats, len(t.obs.paths))
	for name, p := range t.obs.paths {
		st.Paths[name] = *p
	}
	st.LookupRTT = t.obs.lookupRTT.snapshot()
	st.LookupServed = t.obs.lookupServed.snapshot()
	st.LoadSeconds = map[string]Histogram{"ok": t.obs.loadOK.snapshot(), "failed": t.obs.loadFailed.snapshot()}
}

// ConnectFailureCauses are the label values of peer_connect_failures.
var ConnectFailureCauses = control.ConnectFailureCauses

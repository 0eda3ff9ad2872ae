package tier

import (
	"sort"
	"sync/atomic"
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
// telemetry's.
type observations struct {
	rejections map[string]int64
	paths      map[string]*PathStats
	lookupRTT  *histogram
	// lookupServed: peers' lookups held here, arrival to answer sent (what
	// this producer adds to their lookup_rtt_s).
	lookupServed *histogram
	loadOK       *histogram
	loadFailed   *histogram
	// The per-session path and per-peer entries are peerSet's.
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

// telemetry owns what an operator reads of the node besides the other
// owners' gauges: the counters (stats.go) and the observations by cause,
// by path and in histograms. It is their only reader; the ledger and the
// serve desk write the counters they own through a pointer to stats, the
// coordinator the rest through these methods. Guarded by t.mu.
type telemetry struct {
	stats counters
	obs   observations
	// strangerFrames counts the frames dropped without the lock because
	// their sender holds no session (intake.go); they count in frames_in
	// and dropped_frames too.
	strangerFrames atomic.Int64
}

func newTelemetry() telemetry { return telemetry{obs: newObservations()} }

// rejected counts a handshake refused, or a peer not allowed, by cause
// (RejectionCauses).
func (m *telemetry) rejected(cause string) { m.obs.rejections[cause]++ }

// attribute counts a session's load or store report on the data path its
// peer is served on (path), with rows of rowLen bytes.
func (m *telemetry) attribute(r session.Report, path string, rowLen uint64) {
	switch r.Kind {
	case session.LoadDone:
		p := m.obs.path(path)
		if r.OK {
			p.Loads++
			p.BytesIn += int64(len(r.Rows)) * int64(rowLen)
		} else {
			p.LoadFailures++
		}
	case session.StoreDone:
		if r.OK && r.Bytes > 0 {
			p := m.obs.path(path)
			p.Stores++
			p.BytesOut += r.Bytes
		}
	}
}

// fellBack counts a peer served on path although it offered a faster one.
func (m *telemetry) fellBack(path string) { m.obs.path(path).Fallbacks++ }

// loadTook records a load's time from submission to its report.
func (m *telemetry) loadTook(ok bool, d time.Duration) {
	if ok {
		m.obs.loadOK.observe(d.Seconds())
	} else {
		m.obs.loadFailed.observe(d.Seconds())
	}
}

// timedLookup records one of our lookups' round trip.
func (m *telemetry) timedLookup(rtt time.Duration) { m.obs.lookupRTT.observe(rtt.Seconds()) }

// servedLookup records how long a peer's lookup was held here, from its
// arrival to our answer.
func (m *telemetry) servedLookup(held time.Duration) { m.obs.lookupServed.observe(held.Seconds()) }

// peersDue says whether the host's next stats document carries the
// per-peer list at now: peersEvery after the last one delivered.
func (m *telemetry) peersDue(now time.Time) bool {
	return m.obs.peersDelivered.IsZero() || now.Sub(m.obs.peersDelivered) >= peersEvery
}

// peersSent records that a document with the per-peer list reached the host.
func (m *telemetry) peersSent(now time.Time) { m.obs.peersDelivered = now }

// fill writes the counters and observations into st; notAllowedAtAccept is
// the connects the transport refused before the tier saw them.
func (m *telemetry) fill(st *Stats, notAllowedAtAccept uint64) {
	c := &m.stats
	st.FramesIn, st.FramesOut, st.DroppedFrames, st.BadFrames = c.framesIn, c.framesOut, c.droppedFrames, c.badFrames
	stranger := m.strangerFrames.Load()
	st.FramesIn += stranger
	st.DroppedFrames += stranger
	st.InboundLookups = c.inboundLookups
	st.LoadsOK, st.LoadsFailed, st.StoresOK, st.StoresFailed = c.loadsOK, c.loadsFailed, c.storesOK, c.storesFailed
	st.BytesIn, st.BytesOut = c.bytesIn, c.bytesOut
	st.UnboundExpired, st.BadParams = c.unboundExpired, c.badParams
	st.SessionsRefused, st.PeerRestarts = c.sessionsRefused, c.peerRestarts
	st.IntegrityFailures = map[string]int64{IntegrityMismatch: c.integrityMismatch, IntegrityMissing: c.integrityMissing}

	st.HandshakeRejections = make(map[string]int64, len(m.obs.rejections))
	for c, n := range m.obs.rejections {
		st.HandshakeRejections[c] = n
	}
	if notAllowedAtAccept > 0 {
		st.HandshakeRejections[CauseNotAllowed] += int64(notAllowedAtAccept)
	}
	st.Paths = make(map[string]PathStats, len(m.obs.paths))
	for name, p := range m.obs.paths {
		st.Paths[name] = *p
	}
	st.LookupRTT = m.obs.lookupRTT.snapshot()
	st.LookupServed = m.obs.lookupServed.snapshot()
	st.LoadSeconds = map[string]Histogram{"ok": m.obs.loadOK.snapshot(), "failed": m.obs.loadFailed.snapshot()}
}

// observeReport attributes a session's report to its peer and its data
// path; called by apply, with t.mu held.
func (t *Tier) observeReport(r session.Report) {
	t.peers.reported(r)
	if r.Kind == session.LoadDone || r.Kind == session.StoreDone {
		t.telemetry.attribute(r, t.peers.pathOf(r.Session), t.region.RowLen)
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
	t.peers.setPath(s, name)
	if refused != "" {
		t.telemetry.fellBack(name)
		t.peers.failed(s, "data path %s; not faster ones: %s", name, refused)
	}
}

// ConnectFailureCauses are the label values of peer_connect_failures.
var ConnectFailureCauses = control.ConnectFailureCauses

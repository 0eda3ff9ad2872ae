package tier

import (
	"sort"
	"time"

	"github.com/peerkv/peerkv/core/protocol"
	"github.com/peerkv/peerkv/core/session"
)

// The per-peer view: what an operator needs to tell which peer is slow or
// failing. One entry per live session, created with the session
// (peerSet.open) and deleted where it ends (peerSet.forget), so
// there are never more entries than max_peers, and a peer that went is
// gone from the view.

// peersEvery is how often the host's stats document carries the per-peer
// list: a host reads its stats every engine step, and with many peers the
// list would cost that step more than everything else in it (about 15 µs a
// peer to encode and decode); dashboards read it every few seconds.
const peersEvery = time.Second

// HostStats is Stats as peerkv_stats writes it: Peers only when peersEvery
// passed since a document carrying them was delivered (PeersDelivered),
// else nil ("peers": null) and not built at all: with the link figures
// (links.go) building it costs about 13 µs a peer. While the lock stays
// held past the gate's wait, it is the last document built, without
// Peers (hostgate.go).
func (t *Tier) HostStats() Stats {
	if !t.lockForHost(false) {
		if last := t.gate.lastStats.Load(); last != nil {
			st := *last
			st.HostCallsDeferred = t.gate.deferred.Load()
			return st
		}
		t.lockHost() // none built yet: the first waits
	}
	st := t.snapshotLocked(t.telemetry.peersDue(t.now()))
	t.unlockHost()
	last := st
	last.Peers = nil // a stand-in never carries them
	t.gate.lastStats.Store(&last)
	return st
}

// PeersDelivered says a document from HostStats with the per-peer list
// reached the host (not one refused for a too small buffer).
// While the lock stays held it records nothing: the next document carries
// the list again.
func (t *Tier) PeersDelivered() {
	if !t.lockForHost(false) {
		return
	}
	defer t.unlockHost()
	t.telemetry.peersSent(t.now())
}

// PeerStats is one live session's counters, as Stats.Peers lists them.
type PeerStats struct {
	Peer       string `json:"peer"`
	DataPath   string `json:"data_path"` // NoPath until the data path registered the peer
	Handshaked bool   `json:"handshaked"`
	// Dialed: this side opened the session (a source we pull from).
	Dialed     bool    `json:"dialed"`
	AgeSeconds float64 `json:"age_s"`
	// LookupsSent: lookup messages sent to the peer; LookupsAnswered: those
	// whose first answer arrived (timed in LookupRTT).
	LookupsSent     int64 `json:"lookups_sent"`
	LookupsAnswered int64 `json:"lookups_answered"`
	// LookupHits and LookupMisses count keys the peer answered present and
	// absent.
	LookupHits   int64 `json:"lookup_hits"`
	LookupMisses int64 `json:"lookup_misses"`
	// LoadsOK and LoadsFailed count fetch rounds pulled from the peer.
	LoadsOK     int64 `json:"loads_ok"`
	LoadsFailed int64 `json:"loads_failed"`
	BytesIn     int64 `json:"bytes_in"`
	BytesOut    int64 `json:"bytes_out"`
	// LastLookupRTT is the newest lookup round trip, in seconds (0: none yet).
	LastLookupRTT float64   `json:"last_lookup_rtt_s"`
	LookupRTT     Histogram `json:"lookup_rtt_s"`
	// LastError says what last went wrong with this peer ("" if nothing),
	// LastErrorAge how many seconds ago.
	LastError    string  `json:"last_error,omitempty"`
	LastErrorAge float64 `json:"last_error_age_s,omitempty"`
	// Link prices a pull from the peer: round trips, setup, the fitted
	// pull cost, failures by cause (links.go).
	Link LinkStats `json:"link"`
}

// peerStats is the live entry behind a PeerStats; guarded by t.mu.
type peerStats struct {
	PeerStats
	rtt         *histogram
	lastErrorAt time.Time
	link        link
}

// sent counts what we send a peer in its entry.
func (p *peerSet) sent(peerID string, m protocol.Message) {
	if _, ok := m.(*protocol.Lookup); !ok {
		return
	}
	if e := p.statsOf(p.session(peerID)); e != nil {
		e.LookupsSent++
	}
}

// heard counts a peer's frame (err: it did not decode) in its entry,
// before its session handles it.
func (p *peerSet) heard(s *session.Session, m protocol.Message, err error) {
	if err != nil {
		p.failed(s, "malformed frame: %v", err)
		if e := p.statsOf(s); e != nil {
			e.link.failed(FailBadFrame)
		}
		return
	}
	resp, ok := m.(*protocol.LookupResp)
	e := p.statsOf(s)
	if !ok || e == nil {
		return
	}
	for _, hit := range resp.Hits {
		if hit {
			e.LookupHits++
		} else {
			e.LookupMisses++
		}
	}
}

// lookupAnswered times one of our lookups, overall and for its peer
// (session.Env.LookupAnswered); t.mu held.
func (t *Tier) lookupAnswered(s *session.Session, rtt time.Duration) {
	t.telemetry.timedLookup(rtt)
	t.peers.answered(s, rtt)
}

// answered records one of our lookups' round trip in its peer's entry.
func (p *peerSet) answered(s *session.Session, rtt time.Duration) {
	if e := p.statsOf(s); e != nil {
		e.LookupsAnswered++
		e.LastLookupRTT = rtt.Seconds()
		e.rtt.observe(rtt.Seconds())
		e.link.observeRTT(rtt)
	}
}

// reported attributes a load or store report to its peer's entry.
func (p *peerSet) reported(r session.Report) {
	e := p.statsOf(r.Session)
	if e == nil {
		return
	}
	switch r.Kind {
	case session.LoadDone:
		switch {
		case r.OK:
			e.LoadsOK++
			e.BytesIn += int64(len(r.Rows)) * int64(p.env.Region.RowLen)
		case r.Fence:
			e.LoadsFailed++
			e.link.failed(FailTransfer)
			p.failed(r.Session, "load failed: the peer could not supply kv_request_id=%s", r.KVID)
		default:
			e.LoadsFailed++
			e.link.failed(FailAborted)
			p.failed(r.Session, "load aborted (timed out or cancelled): kv_request_id=%s", r.KVID)
		}
	case session.StoreDone:
		if r.OK {
			e.BytesOut += r.Bytes
		}
	}
}

// snapshot lists the live sessions' entries by peer id.
func (p *peerSet) snapshot(now time.Time) []PeerStats {
	out := make([]PeerStats, 0, p.count())
	for s, e := range p.entries {
		v := e.PeerStats
		v.DataPath = p.pathOf(s)
		v.Handshaked = s.Ready()
		v.Dialed = s.Dialed()
		v.AgeSeconds = now.Sub(s.OpenedAt()).Seconds()
		v.LookupRTT = e.rtt.snapshot()
		v.Link = e.link.snapshot(now)
		if !e.lastErrorAt.IsZero() {
			v.LastErrorAge = now.Sub(e.lastErrorAt).Seconds()
		}
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Peer < out[j].Peer })
	return out
}

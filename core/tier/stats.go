package tier

// counters are telemetry's, updated with t.mu held.
type counters struct {
	framesIn, framesOut, droppedFrames, badFrames int64
	framesDecoded                                 int64 // frames screen let through to Decode (intake.go)
	inboundLookups                                int64
	loadsOK, loadsFailed, storesOK, storesFailed  int64
	bytesIn, bytesOut                             int64
	unboundExpired, badParams                     int64
	sessionsRefused                               int64 // connects refused before a session opened
	integrityMismatch, integrityMissing           int64
	peerRestarts                                  int64 // restart.go
}

// Stats is a snapshot of the peer's counters and gauges.
type Stats struct {
	LocalID        string `json:"local_id"`
	DataPaths      string `json:"data_paths"` // e.g. "nixl+tcp"
	Sessions       int    `json:"sessions"`
	SessionsOpened int64  `json:"sessions_opened"`
	SessionsClosed int64  `json:"sessions_closed"`
	Requests       int    `json:"requests"`
	JobsInFlight   int    `json:"jobs_in_flight"`
	JobsUnreported int    `json:"jobs_unreported"`
	ParkedStores   int    `json:"parked_stores"`
	InboundQueued  int    `json:"inbound_queued"`
	InboundActive  int    `json:"inbound_active"`
	ExpectedRows   int    `json:"expected_rows"`
	FramesIn       int64  `json:"frames_in"`
	FramesOut      int64  `json:"frames_out"`
	DroppedFrames  int64  `json:"dropped_frames"`
	BadFrames      int64  `json:"bad_frames"`
	LookupHits     int64  `json:"lookup_hits"`
	LookupMisses   int64  `json:"lookup_misses"`
	InboundLookups int64  `json:"inbound_lookups"`
	LoadsOK        int64  `json:"loads_ok"`
	LoadsFailed    int64  `json:"loads_failed"`
	StoresOK       int64  `json:"stores_ok"`
	StoresFailed   int64  `json:"stores_failed"`
	BytesIn        int64  `json:"bytes_in"`
	BytesOut       int64  `json:"bytes_out"`
	UnboundExpired int64  `json:"unbound_expired"`
	BadParams      int64  `json:"bad_params"`
	// SessionsRefused counts connects refused before a session opened
	// (max_peers, max_peers_per_host, a peer claiming our id).
	SessionsRefused int64 `json:"sessions_refused"`
	// SessionsEvicted counts sessions ended to give their slot to a peer
	// from a less crowded network while every slot was taken (admission.go).
	SessionsEvicted int64 `json:"sessions_evicted"`
	// KVIDsMinted counts kv_request_ids this consumer minted for sources
	// the orchestrator named without one (each is in the request's
	// "pulls from" log line); LoadsSpread counts loads pulled from more
	// than one source; SourceFailovers counts times a load's keys moved to
	// another source after one failed.
	KVIDsMinted     int64 `json:"kv_ids_minted"`
	LoadsSpread     int64 `json:"loads_spread"`
	SourceFailovers int64 `json:"source_failovers"`
	// PeerRestarts counts peers heard starting anew under an identity we
	// held a session with (restart.go): the old session ended, a new one
	// opened.
	PeerRestarts int64 `json:"peer_restarts"`
	// DataPeers is how many peers the data path holds registered.
	DataPeers int `json:"data_peers"`
	// ServeKVIDs and ServeKeysWanted are what remote consumers make this
	// peer hold as a producer: kv ids with state, keys fetched awaiting rows.
	ServeKVIDs      int `json:"serve_kv_ids"`
	ServeKeysWanted int `json:"serve_keys_wanted"`
	// HostCallsDeferred counts host calls that found the lock held by a
	// goroutine past their wait and did without it (hostgate.go): their
	// work was collected or done a step later.
	HostCallsDeferred int64 `json:"host_calls_deferred"`
	// Poisoned says why the peer stopped after an internal error ("" if not).
	Poisoned string `json:"poisoned,omitempty"`

	// IntegrityFailures counts loads of verified pulls that failed their
	// check, by cause (IntegrityCauses); by data path in Paths.
	IntegrityFailures map[string]int64 `json:"integrity_failures"`
	// HandshakeRejections counts failed handshakes by cause (RejectionCauses).
	HandshakeRejections map[string]int64 `json:"handshake_rejections"`
	// PeerConnectFailures counts connects to peers that never came up, by
	// cause (control.ConnectFailureCauses; unreachable.go).
	PeerConnectFailures map[string]int64 `json:"peer_connect_failures"`
	// Paths counts loads, stores, bytes and fallbacks by data path name
	// ("shm", "nixl", "tcp"; "none": a peer never registered).
	Paths map[string]PathStats `json:"paths"`
	// LookupRTT: our lookups' round trips; LookupServed: peers' lookups
	// from their arrival here to our answer; LoadSeconds: loads from submit
	// to report, by result ("ok", "failed"). See observe.go.
	LookupRTT    Histogram            `json:"lookup_rtt_s"`
	LookupServed Histogram            `json:"lookup_served_s"`
	LoadSeconds  map[string]Histogram `json:"load_s"`
	// Peers is one entry per live session, by peer id (peerstats.go); in
	// peerkv_stats at most once a second (HostStats), null in between.
	Peers []PeerStats `json:"peers"`
}

// Stats returns a snapshot.
func (t *Tier) Stats() Stats { return t.snapshot(true) }

// snapshot is Stats, with the per-peer list only when peers is set: it
// costs a host step most when not due (HostStats).
func (t *Tier) snapshot(peers bool) Stats {
	t.mu.Lock()
	defer t.unlockHost()
	return t.snapshotLocked(peers)
}

// snapshotLocked is snapshot with t.mu held.
func (t *Tier) snapshotLocked(peers bool) Stats {
	kvIDs, wanted := 0, 0
	for s := range t.peers.all {
		k, w := s.Holds()
		kvIDs += k
		wanted += w
	}
	poisoned := ""
	if t.life.poisoned != nil {
		poisoned = t.life.poisoned.Error()
	}
	bc := t.book.counts
	st := Stats{
		LocalID: t.ctl.LocalID(), DataPaths: t.dt.Name(), Sessions: t.peers.count(), SessionsOpened: t.peers.counts.opened,
		SessionsClosed: t.peers.counts.closed, Requests: len(t.book.requests), JobsInFlight: t.ledger.inFlight(),
		JobsUnreported: t.ledger.unreported(), ParkedStores: t.desk.parkedStores(), InboundQueued: t.desk.inboundQueued(),
		InboundActive: t.desk.inboundActive(), ExpectedRows: t.book.guard.rowsExpected(),
		LookupHits: bc.lookupHits, LookupMisses: bc.lookupMisses,
		SessionsEvicted: t.peers.counts.evicted, KVIDsMinted: bc.kvIDsMinted, LoadsSpread: bc.loadsSpread,
		SourceFailovers: bc.sourceFailovers, DataPeers: t.peers.reg.count(), ServeKVIDs: kvIDs, ServeKeysWanted: wanted,
		Poisoned: poisoned, HostCallsDeferred: t.gate.deferred.Load(),
	}
	t.telemetry.fill(&st, t.peers.notAllowedAtAccept())
	st.PeerConnectFailures = t.peers.unreach.connectFailureCounts()
	if peers {
		st.Peers = t.peers.snapshot(t.now())
	}
	return st
}

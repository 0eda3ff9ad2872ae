// Package tier is the host-facing node: the calls vLLM's secondary-tier
// interface makes (through capi), over sessions with remote peers.
//
// Threading: every exported method may be called from any goroutine; state is
// guarded by one mutex that is never held across network I/O, so host calls
// return in microseconds. Network progress (inbound frames, transfer
// completions, deadlines) runs on the tier's own goroutine.
//
// Glossary (one word per concept, here and in core/session):
//   - node: this process's tier (one vLLM engine's); peer: always a remote
//     node we hold, or could hold, a session with. (The C API's handle names
//     the node; so do capi's node and Python's Node, whose old name Peer is
//     a deprecated alias.)
//   - host request: a vLLM request (req_id) and its kv_transfer_params.
//   - kv id: the kv_request_id shared by both ends of a transfer: the
//     orchestrator's, or minted by this consumer for a remote_kv_source entry
//     without one.
//   - pull: this node as consumer, loading rows from its sources (remote_prefiller,
//     or remote_kv_source's list); serve: this node as producer, writing rows to a consumer.
//   - part: the keys of one load placed at one source (one fetch round there).
//   - round: one fetch of one kv id (round_seq), with its supply (stored or pinned
//     rows), its demand (the fetch's keys and rows) and its writes in flight.
//   - row: one block of the region (block_len bytes); key: its offload key.
//   - job: a load or store the host submitted, reported exactly once.
//   - inbound lookup: a remote consumer's lookup, evaluated by the host.
//
// The Tier is a coordinator over owners, each the only writer and deleter of
// its state, none holding the Tier:
//   - lifecycle (lifecycle.go): open, closed or poisoned.
//   - peerSet (peerset.go, peerslots.go): the sessions, admission and
//     eviction, refusal pacing, the unreachable back-off, the registry of
//     data-path peers; the only place a session ends (reap returns them).
//   - pullBook (pullbook.go): host requests, their pulls (pull.go), loads
//     and their deadlines (load.go), answers, and the row guard (rowguard.go).
//   - ledger (ledger.go): jobs and their one result each.
//   - serveDesk (servedesk.go, serve.go, outbox.go): served PD kv ids,
//     inbound lookups, the outbox.
//   - hostSide (hostside.go, logs.go, news.go, notify.go): what the host
//     learns without a call reaching it: the log ring and its per-cause
//     limits, the news counts, the notification fd.
//   - intake (intake.go, lanes.go): what is handed to the coordinator to
//     apply under its lock: sessions' reports, the lanes' frames waiting to
//     be decoded, what goroutines found off the lock for the loop.
//   - telemetry (observe.go, stats.go): the counters and the observations
//     by cause, by path and in histograms that Stats reports.
//
// Sessions report what happened as values (session.Report) into the
// intake; settle routes each to its owner and runs the one teardown
// (teardown.go) for sessions that ended, in one step after every call into
// sessions. The host's notification fd is signalled (hostSide.tell) only
// where inbound items (serveDesk.queue), job results (ledger.report) and
// changed answers are queued, and once when the node shuts down or is
// poisoned (hostSide.stopped).
package tier

import (
	"errors"
	"time"
)

// LookupResult values equal vLLM's LookupResult enum.
type LookupResult int32

const (
	Miss       LookupResult = 1
	Hit        LookupResult = 2
	HitPending LookupResult = 3
	Retry      LookupResult = 4
)

func (r LookupResult) String() string {
	switch r {
	case Miss:
		return "MISS"
	case Hit:
		return "HIT"
	case HitPending:
		return "HIT_PENDING"
	case Retry:
		return "RETRY"
	}
	return "INVALID"
}

// Policy is the offload policy a request asks of the host.
type Policy int32

const (
	BlockLevel   Policy = 0
	RequestLevel Policy = 1
)

// JobResult is one finished load or store job.
type JobResult struct {
	JobID    int64
	Success  bool
	IsLoad   bool
	Bytes    int64
	Duration time.Duration
}

// InboundKind says what the host must do with an Inbound item.
type InboundKind int32

const (
	// InboundEvaluate: look Keys up, pin the hits, call AnswerInbound.
	InboundEvaluate InboundKind = 1
	// InboundFinish: the lookup is over; release its context.
	InboundFinish InboundKind = 2
)

// Inbound is one piece of work from a remote consumer's lookup.
type Inbound struct {
	LookupID int64
	Kind     InboundKind
	// First is true on a lookup's first Evaluate (the host starts a context).
	First bool
	// ReqID is the synthetic request id "p2p:<peer>:<kv_request_id>:lu<n>".
	ReqID string
	// Keys to evaluate (Evaluate only).
	Keys [][]byte
}

// Errors returned by tier methods; capi maps them to status codes.
var (
	ErrInvalidArgument = errors.New("invalid argument")
	ErrUnknownRequest  = errors.New("unknown request")
	ErrDuplicate       = errors.New("duplicate id")
	ErrClosed          = errors.New("peer is shut down")
	ErrTimeout         = errors.New("deadline exceeded")
	ErrBadParams       = errors.New("bad kv_transfer_params")
	// ErrInternal: a goroutine of ours panicked; the peer is stopped.
	ErrInternal = errors.New("internal error")
)

package session

import "time"

// roundState is where one fetch round stands on the producer side.
type roundState int8

const (
	// roundOpen: no fetch yet. Supply (stored or pinned rows) may wait for it.
	roundOpen roundState = iota
	// roundFetched: the fetch arrived. Supply meets demand as it comes; the
	// round ends when every row is written, or once no more supply can come
	// and the writes in flight finished.
	roundFetched
	// roundAborting: the consumer aborted while writes were in flight; its
	// abort_ack is owed when they finish.
	roundAborting
	// roundDead: aborted or failed. A tombstone: late supply is refused and
	// a repeated fetch is a protocol error, until it expires.
	roundDead
)

// supply is a stored row waiting for demand: the job that pins it and the row.
type supply struct {
	job int64
	row uint64
}

// round is one fetch round of one kv id as the producer sees it. PD supply
// is always filed under round 0 (the decoder's single fetch). Its state,
// flags, jobs and write counters change only through the methods below
// (supply and demand through holdings.go's).
type round struct {
	state roundState
	since time.Time // when it entered its state: the fetch's and the tombstone's deadlines run from here

	fromLookup   bool // its supply is pinned lookup hits, all there is
	supplyClosed bool // no more supply will come
	fetchSeen    bool // a fetch arrived (kept by a tombstone: a second is a protocol error)

	// available and wanted change only through holdings.go, which keeps
	// the peer's totals (held: nil once the round is no longer filed).
	available map[string]supply // supply no fetch asked for yet
	wanted    map[string]uint64 // key -> consumer row, demand awaiting supply
	held      *holdings
	jobs      map[int64]struct{}
	remaining int // rows of the fetch still to write
	inflight  int // data-path writes running

	// Verified pulls: the fetch's rows (non-nil only when the session
	// verifies) and the checksum of each row written so far.
	fetchRows []uint64
	sums      map[uint64]uint64
}

// verify makes the round collect row checksums for its transfer_done.
func (r *round) verify(rows []uint64) {
	r.fetchRows = rows
	r.sums = make(map[uint64]uint64, len(rows))
}

// landed records the sums of rows a transfer wrote (parallel to dst).
func (r *round) landed(dst []uint64, sums []uint64) {
	if r.sums == nil || len(sums) != len(dst) {
		return
	}
	for i, row := range dst {
		r.sums[row] = sums[i]
	}
}

// rowSums lists the sums in the fetch's order, or nil when a row has none
// (a transfer that carried none): the consumer then fails the load.
func (r *round) rowSums() []uint64 {
	out := make([]uint64, len(r.fetchRows))
	for i, row := range r.fetchRows {
		sum, ok := r.sums[row]
		if !ok {
			return nil
		}
		out[i] = sum
	}
	return out
}

func newRound() *round {
	return &round{available: map[string]supply{}, wanted: map[string]uint64{}, jobs: map[int64]struct{}{}}
}

func (r *round) live() bool { return r.state == roundOpen || r.state == roundFetched }

// fetch records the fetch's demand of rows rows.
func (r *round) fetch(now time.Time, rows int) {
	r.fetchSeen = true
	r.remaining = rows
	if r.live() {
		r.state, r.since = roundFetched, now
	}
}

// closeSupply: no more supply will come for the round.
func (r *round) closeSupply() { r.supplyClosed = true }

// addJob files a host job whose rows supply the round; fromLookup says
// they are pinned lookup hits, all the supply there is.
func (r *round) addJob(job int64, fromLookup bool) {
	r.jobs[job] = struct{}{}
	if fromLookup {
		r.fromLookup = true
	}
}

// dropJob forgets a job that was reported.
func (r *round) dropJob(job int64) { delete(r.jobs, job) }

// dropJobs forgets every job, all reported.
func (r *round) dropJobs() { clear(r.jobs) }

// writeStarted counts a data-path write of the round's rows.
func (r *round) writeStarted() { r.inflight++ }

// writeEnded counts a write that finished: its rows written (ok, with
// their sums) or the round failed.
func (r *round) writeEnded(now time.Time, ok bool, rows int, dst []uint64, sums []uint64) {
	r.inflight--
	if !ok {
		r.kill(now, false)
		return
	}
	if r.live() {
		r.remaining -= rows
		r.landed(dst, sums)
	}
}

// abort applies the consumer's abort_fetch: a live round dies with its
// abort_ack owed (true: its jobs no write carries can go); a failed one
// owes the ack too, once its writes in flight finished.
func (r *round) abort(now time.Time) (wasLive bool) {
	switch r.state {
	case roundOpen, roundFetched:
		r.kill(now, true)
		return true
	case roundDead:
		r.state = roundAborting
	}
	return false
}

// acked settles an aborting round once its writes finished: it becomes a
// tombstone, and true says its abort_ack goes now.
func (r *round) acked() bool {
	if r.state != roundAborting {
		return false
	}
	r.state = roundDead
	return true
}

// entomb keeps a round that is no longer live, its jobs reported, as a
// tombstone (true) that refuses a repeated fetch until it expires; a live
// round is not kept (false).
func (r *round) entomb() bool {
	if r.live() {
		return false
	}
	r.fetchSeen = true
	return true
}

// kill makes the round a tombstone, or aborting while writes run and an
// abort_ack is owed.
func (r *round) kill(now time.Time, ackOwed bool) {
	if !r.live() {
		return
	}
	r.supplyClosed = true
	r.state, r.since = roundDead, now
	if ackOwed {
		r.state = roundAborting
	}
}

// succeeded is true once every demanded row was written, alive.
func (r *round) succeeded() bool { return r.state == roundFetched && r.remaining == 0 }

// ready says the round can end now: nothing is in flight and either the
// demand is met, no more supply can meet it, or it is dead.
func (r *round) ready() bool {
	if r.inflight > 0 {
		return false
	}
	switch r.state {
	case roundFetched:
		return r.remaining == 0 || r.supplyClosed
	case roundAborting, roundDead:
		return true
	}
	return false
}

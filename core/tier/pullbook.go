package tier

import (
	"time"

	"github.com/peerkv/peerkv/core/params"
	"github.com/peerkv/peerkv/core/session"
)

// pullBook is the consumer side of the tier: the host's requests, their
// pulls (by request and by kv id), the loads pulled for them with their
// deadlines, the answers queued for a caching host, the first asks
// deferred to the loop, and the row guard the data paths consult. It is
// the only writer and deleter of all of them. It never holds the Tier:
// what it needs of the coordinator comes as bookHooks, and it reaches a
// source only through sourceSession. Every method runs with the tier's
// lock held, except the guard's readers (data paths).
type pullBook struct {
	h           bookHooks
	loadTimeout time.Duration // load_timeout_s
	keyLen      int           // key_len: the room reserved per key
	rowLen      int64         // bytes of one row, for a load's report

	requests map[string]*request // created by start, deleted by finish
	pulls    pullIndex           // live pulls by kv id: added by start, removed by finish
	// loads in flight by job id: created by startLoad, deleted by
	// settleLoad (the one report) or dropped by failAll once the ledger
	// reported every job (shutdown, poison).
	loads      map[int64]*pullLoad
	stale      []*pull // pulls to re-evaluate at the end of settle
	answered   []*pull // pulls with changes for TakeAnswers
	toRegister []*pull // pulls with a first ask to register (asked.go)
	// registerWake has the loop register deferred asks (asked.go).
	registerWake chan struct{}
	guard        *rowGuard // rows each peer may write into our region
	counts       pullCounts
}

// pullCounts are the book's counters, read by Stats.
type pullCounts struct {
	lookupHits, lookupMisses                  int64
	kvIDsMinted, loadsSpread, sourceFailovers int64
}

// bookHooks is what the book needs of the coordinator.
type bookHooks struct {
	now func() time.Time
	// closed: the peer is closing (no load may start over elsewhere, no
	// lookup is answered but MISS).
	closed func() bool
	// sessionFor is the live session to a source, opened if allowed.
	sessionFor func(peerID string) (sourceSession, error)
	// report gives a job's single outcome to the ledger.
	report func(jobID int64, ok bool, bytes int64)
	// fence cuts a peer's writes under way into our region.
	fence func(peerID string)
	// fetched feeds one fetch that landed (bytes, sent until its report)
	// to its peer's pull model.
	fetched func(r session.Report, bytes int64, took time.Duration)
	// answersNews tells the host answers are queued (wake: signal its fd).
	answersNews func(wake bool)
	logf        Logf
}

// sourceSession is everything the book asks of the session to one source
// (a *session.Session): the whole surface where pulls cross into sessions.
type sourceSession interface {
	PeerID() string
	Dead() bool
	Ready() bool
	ReserveLookups(kvID string, n int)
	RegisterLookup(kvID string, key []byte) (hit, known bool)
	Probed(kvID string, key []byte) (hit, known bool)
	FlushLookup(kvID string)
	RequestBlocks(jobID int64, kvID string, keys [][]byte, rows []uint64) uint64
	AbortLoad(kvID string, round uint64)
	EndLookup(kvID string) bool
	FinishConsumer(kvID string)
}

// request is one host request the tier knows.
type request struct {
	id   string
	pull *pull // its sources (remote_prefiller, remote_kv_source), nil if none
	dest *params.Dest
}

func newPullBook(h bookHooks, loadTimeout time.Duration, keyLen int, rowLen, rows uint64, verified bool) *pullBook {
	return &pullBook{
		h: h, loadTimeout: loadTimeout, keyLen: keyLen, rowLen: int64(rowLen),
		requests:     map[string]*request{},
		pulls:        pullIndex{},
		loads:        map[int64]*pullLoad{},
		registerWake: make(chan struct{}, 1),
		guard:        newRowGuard(rows, verified),
	}
}

// request is the live request reqID, nil if none.
func (b *pullBook) request(reqID string) *request { return b.requests[reqID] }

// start records a new request (reqID not live) and starts pulling from its
// sources, if any; it reports whether it does.
func (b *pullBook) start(reqID string, dest *params.Dest, sources []params.Source) bool {
	r := &request{id: reqID, dest: dest}
	b.requests[reqID] = r
	if len(sources) == 0 {
		return false
	}
	r.pull = b.startPull(reqID, sources)
	b.pulls.add(r.pull)
	return true
}

// finish forgets request reqID and ends its pull: its loads fail (still
// reported once), its sources are told. It returns the request, nil if
// there was none.
func (b *pullBook) finish(reqID string) *request {
	r := b.requests[reqID]
	if r == nil {
		return nil
	}
	delete(b.requests, reqID)
	if r.pull != nil {
		r.pull.told.ended = true
		b.pulls.remove(r.pull)
		b.endLoads(r.pull)
		r.pull.finish()
	}
	return r
}

// purge is the book's part of a session's end: the pulls it served are
// re-evaluated, as their answers may change without it.
func (b *pullBook) purge(s sourceSession) {
	for _, r := range b.requests {
		if r.pull != nil && r.pull.uses(s) {
			b.markStale(r.pull)
		}
	}
}

// failAll is the book's part of the peer stopping, once the ledger
// reported every job: a caching host learns that every request it holds
// answers for fails, and no load is left to report.
func (b *pullBook) failAll() {
	b.failCachedPulls()
	b.forgetLoads()
}

// submitLoad pulls keys of request reqID into rows for job jobID, admitted
// at: it reports the job at once when there is nothing to pull, and says
// whether a load started.
func (b *pullBook) submitLoad(reqID string, jobID int64, at time.Time, keys [][]byte, rows []uint64) bool {
	r := b.requests[reqID]
	switch {
	case len(keys) == 0:
		b.h.report(jobID, true, 0)
	case r == nil || r.pull == nil:
		b.h.logf("WARNING", "load job %d for request %s, which pulls from no peer; failing it", jobID, reqID)
		b.h.report(jobID, false, 0)
	case r.pull.failed:
		b.h.report(jobID, false, 0)
	default:
		b.startLoad(jobID, at, r.pull, copyKeys(keys), rows)
		return true
	}
	return false
}

// loadDone applies a session's LoadDone for one of its loads' parts.
func (b *pullBook) loadDone(s sourceSession, r session.Report) {
	l := b.loads[r.JobID]
	if l == nil {
		b.h.logf("ERROR", "internal: load job %d ended at %s, but no such load is in flight (ignored)", r.JobID, s.PeerID())
		return
	}
	b.partEnded(l, s, r)
}

// sourceFailed marks down the sources that s serves under kv.
func (b *pullBook) sourceFailed(s sourceSession, kv, why string) {
	for _, p := range b.pulls[kv] {
		p.sourceFailed(s, kv, why)
	}
}

// wakeRegister has the loop register deferred asks.
func (b *pullBook) wakeRegister() {
	select {
	case b.registerWake <- struct{}{}:
	default:
	}
}

func (b *pullBook) countAnswer(res LookupResult) {
	switch res {
	case Hit:
		b.counts.lookupHits++
	case Miss:
		b.counts.lookupMisses++
	}
}

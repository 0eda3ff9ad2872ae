package tier

import (
	"fmt"
	"slices"
	"time"

	"github.com/peerkv/peerkv/core/session"
)

// pullLoad is one load job pulled from a request's sources: the one owner
// of its parts, its deadline and its single report. Each key is in at most
// one part at a time; a part is one fetch round at one source.
//
// A part that fails (transfer_done failed, abort without the load ending,
// session lost) marks its source down for the request and sends its keys
// to another live source: one that reported them when the load was
// submitted, else any that has not refused them in this load (it may
// report them late); the key is looked up there again (a fetch may only
// name keys its round reported) and fetched when it answers. Once a key has
// nowhere left to come from, or the deadline (load_timeout_s from submit)
// passes, the load fails: parts in flight are aborted and the failure is
// reported once none is, so no row is handed back while a source may
// still write it.
type pullLoad struct {
	jobID    int64
	pull     *pull
	keys     [][]byte
	rows     []uint64
	deadline time.Time
	holders  []sourceSet // per key: the sources that reported it at submit
	refused  []sourceSet // per key: sources that failed it or missed it since
	perSrc   []int       // rows given to each source in this load (spreading)
	parts    []*loadPart
	landed   int    // rows written by parts that succeeded
	failure  string // why it fails ("" = it does not); reported once no part is in flight
}

type partState int8

const (
	partProbing  partState = iota // its keys are being looked up at the source again
	partFetching                  // its fetch round is in flight
)

// loadPart is a subset of a load's keys at one source.
type loadPart struct {
	src   int
	keys  []int // indexes into the load's keys
	state partState
	round uint64 // partFetching: the session's round
	// sentAt: when its fetch was sent (the pull model's start, links.go);
	// zero when it is no sample: it waited for the session's handshake
	// (setup is apart), or is PD's, which may wait for the prefill.
	sentAt time.Time
}

// startLoad places a load's keys on the sources that reported them and
// sends one fetch per source; its deadline runs from at, when the job was
// admitted.
func (b *pullBook) startLoad(jobID int64, at time.Time, p *pull, keys [][]byte, rows []uint64) {
	l := &pullLoad{
		jobID: jobID, pull: p, keys: keys, rows: rows, deadline: at.Add(b.loadTimeout),
		holders: make([]sourceSet, len(keys)), refused: make([]sourceSet, len(keys)),
		perSrc: make([]int, len(p.sources)),
	}
	b.loads[jobID] = l
	b.registerAsked(p)
	for i, k := range keys {
		l.holders[i] = p.holders(k)
		if l.holders[i].empty() {
			// Reported in a round another load's fetch closed: asked
			// again there (probePart) before it is fetched.
			l.holders[i] = p.reportedBefore(k)
		}
		if l.holders[i].empty() {
			b.failLoad(l, fmt.Sprintf("no source reported key %d of %d", i, len(keys)))
			return
		}
	}
	all := make([]int, len(keys))
	for i := range all {
		all[i] = i
	}
	b.placeKeys(l, all, l.holders)
	if l.failure == "" && len(l.parts) > 1 {
		b.counts.loadsSpread++
	}
}

// placeKeys deals keys (indexes) out to cands[key] and starts a part per
// source: fetched now when the source reported them in its current round,
// else looked up there first.
func (b *pullBook) placeKeys(l *pullLoad, idx []int, cands []sourceSet) {
	sets := make([]sourceSet, len(idx))
	for n, i := range idx {
		sets[n] = cands[i]
	}
	bySrc := map[int]*loadPart{}
	var order []*loadPart
	for n, src := range place(sets, l.perSrc) {
		if src < 0 {
			b.failLoad(l, fmt.Sprintf("key %d of %d: no other source has it", idx[n], len(l.keys)))
			return
		}
		part := bySrc[src]
		if part == nil {
			part = &loadPart{src: src}
			bySrc[src] = part
			order = append(order, part)
		}
		part.keys = append(part.keys, idx[n])
	}
	for _, part := range order {
		if l.failure != "" {
			return // starting an earlier part doomed the load
		}
		l.parts = append(l.parts, part)
		b.probePart(l, part)
	}
}

// probePart fetches a probing part's keys once its source answered for all
// of them; keys it misses go elsewhere.
func (b *pullBook) probePart(l *pullLoad, part *loadPart) {
	src := l.pull.sources[part.src]
	l.pull.live()
	if l.failure != "" {
		b.dropPart(l, part)
		b.settleLoad(l)
		return
	}
	if src.down != "" {
		b.dropPart(l, part)
		b.retryKeys(l, part.src, part.keys)
		return
	}
	var hits, misses []int
	pending := false
	for _, i := range part.keys {
		if !l.pull.probe { // PD: the prefiller is never asked, it has every key
			hits = append(hits, i)
			continue
		}
		hit, known := src.s.RegisterLookup(src.KVRequestID, l.keys[i])
		switch {
		case !known:
			pending = true
		case hit:
			hits = append(hits, i)
		default:
			misses = append(misses, i)
		}
	}
	if pending {
		src.s.FlushLookup(src.KVRequestID)
		return // asked again on every tick until it answers or the load's deadline
	}
	part.keys = hits
	if len(hits) == 0 {
		b.dropPart(l, part)
	} else {
		keys, rows := l.subset(hits)
		b.guard.expect(src.PeerID(), rows, true)
		sample := l.pull.probe && src.s.Ready()
		part.round = src.s.RequestBlocks(l.jobID, src.KVRequestID, keys, rows)
		part.state = partFetching
		if sample {
			part.sentAt = b.h.now()
		}
	}
	if len(misses) > 0 {
		b.retryKeys(l, part.src, misses)
	}
}

// retryKeys sends keys that failed at source from to another source.
func (b *pullBook) retryKeys(l *pullLoad, from int, idx []int) {
	for _, i := range idx {
		l.refused[i] = l.refused[i].with(from)
	}
	if l.failure != "" {
		return
	}
	if b.h.closed() {
		b.failLoad(l, "the peer is shutting down")
		return
	}
	if !b.h.now().Before(l.deadline) {
		b.failLoad(l, fmt.Sprintf("source %s failed and the load's deadline (load_timeout_s %v) has passed",
			l.pull.sources[from].PeerID(), b.loadTimeout))
		return
	}
	live := l.pull.liveSet()
	cands := make([]sourceSet, len(l.keys))
	for _, i := range idx {
		cands[i] = l.holders[i].without(l.refused[i]) & live
		if cands[i].empty() { // nobody else reported it at submit: one may report it now
			cands[i] = live.without(l.refused[i])
		}
		if cands[i].empty() {
			b.failLoad(l, fmt.Sprintf("source %s failed it and no other source is left for key %d of %d",
				l.pull.sources[from].PeerID(), i, len(l.keys)))
			return
		}
	}
	b.counts.sourceFailovers++
	b.h.logf("WARNING", "load job %d: %d key(s) from %s fail over to the request's other sources",
		l.jobID, len(idx), l.pull.sources[from].PeerID())
	b.placeKeys(l, idx, cands)
}

// partEnded applies a part's LoadDone, which session s reported.
func (b *pullBook) partEnded(l *pullLoad, s sourceSession, r session.Report) {
	at := slices.IndexFunc(l.parts, func(p *loadPart) bool {
		src := l.pull.sources[p.src]
		return p.state == partFetching && src.s == s && src.KVRequestID == r.KVID && p.round == r.Round
	})
	if at < 0 {
		b.h.logf("ERROR", "internal: load job %d: no part fetches kv_request_id=%s round %d from %s (ignored)",
			l.jobID, r.KVID, r.Round, s.PeerID())
		return
	}
	part := l.parts[at]
	src := l.pull.sources[part.src]
	if r.Fence {
		// Cut the source's writes in flight before these rows go to another
		// source or back to the host.
		b.h.fence(src.PeerID())
	}
	b.guard.expect(src.PeerID(), r.Rows, false)
	b.dropPart(l, part)
	if r.OK {
		l.landed += len(part.keys)
		if !part.sentAt.IsZero() {
			b.h.fetched(r, int64(len(r.Rows))*b.rowLen, b.h.now().Sub(part.sentAt))
		}
	} else if l.failure == "" {
		if src.down == "" {
			src.down = fmt.Sprintf("it failed load job %d", l.jobID)
		}
		b.retryKeys(l, part.src, part.keys)
	}
	b.settleLoad(l)
}

// failLoad dooms the load: nothing more is asked, fetches in flight are
// aborted, and the failure is reported once none is.
func (b *pullBook) failLoad(l *pullLoad, why string) {
	if l.failure != "" {
		return
	}
	l.failure = why
	b.h.logf("WARNING", "load job %d fails: %s; the request recomputes", l.jobID, why)
	for _, part := range slices.Clone(l.parts) {
		if part.state == partProbing {
			b.dropPart(l, part)
			continue
		}
		src := l.pull.sources[part.src]
		if !src.s.Dead() {
			src.s.AbortLoad(src.KVRequestID, part.round)
		}
	}
	b.settleLoad(l)
}

// settleLoad reports the load once it is over: every key landed, or it
// failed and no part is in flight.
func (b *pullBook) settleLoad(l *pullLoad) {
	if len(l.parts) > 0 {
		return
	}
	if b.loads[l.jobID] != l {
		return // reported already (shutdown, poison)
	}
	delete(b.loads, l.jobID)
	if l.failure != "" {
		l.pull.failed = true // this request recomputes
		b.markStale(l.pull)
		b.h.report(l.jobID, false, 0)
		return
	}
	l.pull.markLanded(l.keys)
	b.releaseServed(l.pull)
	b.h.report(l.jobID, true, int64(l.landed)*b.rowLen)
}

// releaseServed ends the lookups of p's sources that can give the request
// nothing more: each has answered every key the host asked up to the end
// of the prefix, and every key it reported is already in the host's CPU
// rows (from another source). Their answers pinned rows no fetch will read, and a producer's
// engine keeps stepping while its rows are pinned (vLLM steps while its
// manager holds jobs), so they go now rather than when the request ends.
// Checked when a load lands and when a source answers after one did. A
// source a fetch served holds no such pins and keeps serving: its answers
// still stand for the keys it gave.
func (b *pullBook) releaseServed(p *pull) {
	if !p.probe || p.landedKeys == 0 {
		return // PD: the prefiller is the only source, asked nothing
	}
	for _, src := range p.sources {
		// EndLookup ends only the lookups of a source that holds answers.
		if src.down != "" || src.s.Dead() || !p.servedBy(src) || !src.s.EndLookup(src.KVRequestID) {
			continue
		}
		src.down = "released: every key it reported was loaded from another source"
	}
}

// servedBy reports whether src answered every key of p up to the end of
// its prefix (the first MISS: no key after it is ever loaded) and each key
// it reported as a hit has landed.
func (p *pull) servedBy(src *pullSource) bool {
	for _, a := range p.order {
		if a.last == Miss {
			return true
		}
		hit, known := src.s.Probed(src.KVRequestID, a.key)
		if !known || (hit && !a.landed) {
			return false
		}
	}
	return true
}

// markLanded records that a successful load wrote the rows of its keys.
func (p *pull) markLanded(keys [][]byte) {
	for _, k := range keys {
		if a := p.byKey[string(k)]; a != nil && !a.landed {
			a.landed = true
			p.landedKeys++
		}
	}
}

// tickLoads applies loads' deadlines and asks probing parts again.
func (b *pullBook) tickLoads(now time.Time) {
	for _, l := range b.loads {
		if len(l.parts) == 0 {
			continue
		}
		if !now.Before(l.deadline) {
			b.failLoad(l, fmt.Sprintf("not every key arrived within load_timeout_s (%v)", b.loadTimeout))
			continue
		}
		for _, part := range slices.Clone(l.parts) {
			if part.state == partProbing && l.failure == "" {
				b.probePart(l, part)
			}
		}
	}
}

// endLoads fails the unreported loads of a finishing request.
func (b *pullBook) endLoads(p *pull) {
	for _, l := range b.loads {
		if l.pull == p {
			b.failLoad(l, "its request finished")
		}
	}
}

// forgetLoads drops every load: the ledger reported their jobs as the
// peer stopped, so none may be reported again.
func (b *pullBook) forgetLoads() { clear(b.loads) }

func (b *pullBook) dropPart(l *pullLoad, part *loadPart) {
	if i := slices.Index(l.parts, part); i >= 0 {
		l.parts = slices.Delete(l.parts, i, i+1)
	}
}

func (l *pullLoad) subset(idx []int) ([][]byte, []uint64) {
	keys, rows := make([][]byte, len(idx)), make([]uint64, len(idx))
	for n, i := range idx {
		keys[n], rows[n] = l.keys[i], l.rows[i]
	}
	return keys, rows
}

package tier

import (
	"time"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/session"
)

// serveDesk owns what this node serves to its peers: the PD kv ids it serves
// as a prefiller (serve.go), the inbound lookups the host evaluates with
// the queue of their work (here), and the frames waiting behind a deferred
// answer (outbox.go). It is the only writer and deleter of each, and holds
// the serving deadlines (tick). A session's end reaches it as purge; the
// node's end as clear. Owned under t.mu.
type serveDesk struct {
	serving       map[string]*serveKV // PD kv ids this node serves as a prefiller
	parkedBatches int                 // store batches parked in serving, summed
	inbound       inboundQueue        // work for the host's serve pass
	lookups       map[int64]*session.InboundLookup
	nextLookup    int64
	outbox        outbox // frames waiting behind a deferred answer

	cfg  config.Config
	now  func() time.Time
	logf Logf
	// report is the ledger's: parked stores that expire fail their jobs.
	report func(jobID int64, ok bool, bytes int64)
	// counts: inbound lookups taken and parked stores expired; the desk is
	// the only writer of those counters.
	counts *counters
	// wake tells the host an inbound item is queued.
	wake func()
}

func newServeDesk(cfg config.Config, now func() time.Time, logf Logf,
	report func(jobID int64, ok bool, bytes int64), counts *counters, wake func()) *serveDesk {
	return &serveDesk{
		serving: map[string]*serveKV{},
		lookups: map[int64]*session.InboundLookup{},
		outbox:  newOutbox(),
		cfg:     cfg, now: now, logf: logf, report: report, counts: counts, wake: wake,
	}
}

// purge forgets what the desk holds for an ended session: its fetch
// bindings, its inbound lookups (queued items for them are skipped when
// reached) and the frames waiting for its peer.
func (d *serveDesk) purge(s *session.Session) {
	d.unbindServing(s)
	for id, l := range d.lookups {
		if l.Session() == s {
			delete(d.lookups, id)
		}
	}
	d.outbox.drop(s.PeerID())
}

// clear forgets everything at the peer's end. Parked stores are jobs: the
// ledger fails them with every other job.
func (d *serveDesk) clear() {
	d.clearServing()
	clear(d.lookups)
	d.inbound = inboundQueue{}
	d.outbox.clear()
}

// pending is true while the host has work here: items to evaluate, or
// stores parked for a decoder.
func (d *serveDesk) pending() bool { return d.inbound.len() > 0 || d.parkedBatches > 0 }

// inboundQueued and inboundActive are the gauges of the inbound work.
func (d *serveDesk) inboundQueued() int { return d.inbound.len() }
func (d *serveDesk) inboundActive() int { return len(d.lookups) }

// nextLookupID is session.Env.NextLookupID: a fresh inbound lookup id.
func (d *serveDesk) nextLookupID() int64 {
	d.nextLookup++
	return d.nextLookup
}

// inboundReady indexes a session's new lookup and queues it for the host.
func (d *serveDesk) inboundReady(l *session.InboundLookup) {
	d.lookups[l.ID] = l
	d.queue(inboundItem{id: l.ID, kind: InboundEvaluate}, false)
	d.counts.inboundLookups++
}

// inboundFinished forgets a lookup the session answered for good; its
// queued Evaluate item, if any, is skipped when reached.
func (d *serveDesk) inboundFinished(l *session.InboundLookup) {
	delete(d.lookups, l.ID)
	if l.OwesFinish() {
		d.queue(inboundItem{id: l.ID, kind: InboundFinish, reqID: l.ReqID}, false)
	}
}

// lookup returns the live inbound lookup id, nil if it ended.
func (d *serveDesk) lookup(id int64) *session.InboundLookup { return d.lookups[id] }

// answered records the host's answers applied to l: finished, it is
// forgotten; else the rest of a large lookup is offered in this pass, and
// keys answered "later" in the next.
func (d *serveDesk) answered(l *session.InboundLookup, finished bool) {
	if finished {
		delete(d.lookups, l.ID)
		return
	}
	d.queue(inboundItem{id: l.ID, kind: InboundEvaluate}, l.NextPass())
}

// queue is the one place inbound items are queued for NextInbound: now for
// this serve pass, or (re-offers of HIT_PENDING/RETRY keys) for the next
// one. Either way the host must call again, so it is woken.
func (d *serveDesk) queue(it inboundItem, nextPass bool) {
	if nextPass {
		d.inbound.postpone(it)
	} else {
		d.inbound.push(it)
	}
	d.wake()
}

// next returns the head of the inbound queue; see Tier.NextInbound.
func (d *serveDesk) next(fits func(Inbound) bool) (Inbound, bool, bool) {
	q := &d.inbound
	for {
		if len(q.now) == 0 {
			// End of a pass: what was deferred is offered in the next one.
			q.now, q.later = q.later, q.now[:0]
			return Inbound{}, false, false
		}
		it := q.now[0]
		in := Inbound{LookupID: it.id, Kind: it.kind, ReqID: it.reqID}
		var l *session.InboundLookup
		if it.kind == InboundEvaluate {
			if l = d.lookups[it.id]; l == nil { // ended while queued: nothing is owed
				q.now = q.now[1:]
				continue
			}
			in.ReqID = l.ReqID
			in.First = !l.Evaluated()
			in.Keys = l.Pending()
		}
		if fits != nil && !fits(in) {
			return in, true, false
		}
		q.now = q.now[1:]
		if l != nil {
			l.CheckOut()
		}
		return in, true, true
	}
}

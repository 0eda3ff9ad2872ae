package tier

import (
	"fmt"

	"github.com/peerkv/peerkv/core/session"
)

type inboundItem struct {
	id    int64
	kind  InboundKind
	reqID string // for Finish items, whose lookup is gone
}

// inboundQueue holds the host's work for its serve pass. Items re-offered
// because keys were still pending wait in later until the current pass ends
// (the host saw an empty queue), so one pass never spins on them.
type inboundQueue struct {
	now   []inboundItem
	later []inboundItem
}

func (q *inboundQueue) push(it inboundItem)     { q.now = append(q.now, it) }
func (q *inboundQueue) postpone(it inboundItem) { q.later = append(q.later, it) }
func (q *inboundQueue) len() int                { return len(q.now) + len(q.later) }

// NextInbound returns the head of the inbound queue; see the tierapi notes.
func (t *Tier) NextInbound(fits func(Inbound) bool) (Inbound, bool, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for {
		if len(t.inbound.now) == 0 {
			// End of a pass: what was deferred is offered in the next one.
			t.inbound.now, t.inbound.later = t.inbound.later, t.inbound.now[:0]
			return Inbound{}, false, false
		}
		it := t.inbound.now[0]
		in := Inbound{LookupID: it.id, Kind: it.kind, ReqID: it.reqID}
		var l *session.InboundLookup
		if it.kind == InboundEvaluate {
			if l = t.lookups[it.id]; l == nil { // ended while queued: nothing is owed
				t.inbound.now = t.inbound.now[1:]
				continue
			}
			in.ReqID = l.ReqID
			in.First = !l.Evaluated()
			in.Keys = l.Pending()
		}
		if fits != nil && !fits(in) {
			return in, true, false
		}
		t.inbound.now = t.inbound.now[1:]
		if l != nil {
			l.CheckOut()
		}
		return in, true, true
	}
}

// AnswerInbound applies the host's answers to an Evaluate item.
func (t *Tier) AnswerInbound(lookupID int64, results []LookupResult, pinJobID int64, pinSlots []int64) (bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := t.usable(); err != nil {
		return true, err
	}
	rows, err := t.checkSlots(pinSlots)
	if err != nil {
		return false, err
	}
	answers := make([]session.Answer, len(results))
	for i, r := range results {
		switch r {
		case Hit:
			answers[i] = session.AnswerHit
		case Miss:
			answers[i] = session.AnswerMiss
		case HitPending, Retry:
			answers[i] = session.AnswerLater
		default:
			return false, fmt.Errorf("%w: results[%d]=%d is not a lookup result", ErrInvalidArgument, i, r)
		}
	}
	l := t.lookups[lookupID]
	if l != nil && !l.CheckedOut() {
		return false, fmt.Errorf("%w: lookup %d was not handed out for evaluation", ErrInvalidArgument, lookupID)
	}
	if len(pinSlots) > 0 {
		if _, err := t.admitJob(pinJobID, false, rows); err != nil {
			return false, err
		}
	}
	if l == nil {
		// Dropped while the host evaluated it: release the pins now.
		if len(pinSlots) > 0 {
			t.report(pinJobID, false, 0)
		}
		return true, nil
	}
	finished, err := l.Session().AnswerLookup(l, answers, pinJobID, rows)
	if err != nil { // nothing changed: the lookup stays checked out
		if len(pinSlots) > 0 {
			delete(t.jobs, pinJobID)
		}
		return false, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	if finished {
		delete(t.lookups, lookupID)
	} else {
		// The rest of a large lookup is offered in this pass; keys
		// answered "later" in the next.
		t.queueInbound(inboundItem{id: lookupID, kind: InboundEvaluate}, l.NextPass())
	}
	t.settle()
	return finished, nil
}

// dropInbound forgets the inbound work of a closed session.
func (t *Tier) dropInbound(s *session.Session) {
	for id, l := range t.lookups {
		if l.Session() == s {
			delete(t.lookups, id) // queued items for it are skipped when reached
		}
	}
}

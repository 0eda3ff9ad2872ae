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
// While the lock stays held it returns none (hostgate.go).
func (t *Tier) NextInbound(fits func(Inbound) bool) (Inbound, bool, bool) {
	if !t.lockForHost() {
		t.missedNews(NewsInbound)
		return Inbound{}, false, false
	}
	defer t.unlockHost()
	return t.desk.next(fits)
}

// AnswerInbound applies the host's answers to an Evaluate item.
func (t *Tier) AnswerInbound(lookupID int64, results []LookupResult, pinJobID int64, pinSlots []int64) (bool, error) {
	t.lockHost()
	defer t.unlockHost()
	if err := t.life.usable(); err != nil {
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
	l := t.desk.lookup(lookupID)
	if l != nil && !l.CheckedOut() {
		return false, fmt.Errorf("%w: lookup %d was not handed out for evaluation", ErrInvalidArgument, lookupID)
	}
	pins := len(pinSlots) > 0
	if pins {
		if err := t.ledger.mayAdmit(pinJobID); err != nil {
			return false, err
		}
	}
	if l == nil {
		// Dropped while the host evaluated it: release the pins now.
		if pins {
			t.admitPins(pinJobID)
			t.ledger.report(pinJobID, false, 0)
		}
		return true, nil
	}
	finished, err := l.Session().AnswerLookup(l, answers, pinJobID, rows)
	if err != nil { // nothing changed: the lookup stays checked out, no job was admitted
		return false, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	if pins {
		// Admitted once the answer holds (a job is deleted only by its
		// report); its report comes from the session, applied in settle.
		t.admitPins(pinJobID)
	}
	t.desk.answered(l, finished)
	t.settle()
	return finished, nil
}

// admitPins records the store job that holds an answer's pinned rows;
// AnswerInbound checked it may be admitted.
func (t *Tier) admitPins(jobID int64) {
	if _, err := t.ledger.admit(jobID, false); err != nil {
		t.logf("ERROR", "internal: %v", err)
	}
}

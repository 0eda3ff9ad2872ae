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
	if !t.lockForHost(true) {
		t.missedNews(NewsInbound)
		return Inbound{}, false, false
	}
	defer t.unlockHost()
	in, ok, taken := t.desk.next(fits)
	if taken && in.Kind == InboundEvaluate {
		t.gate.handedOut(in.LookupID, in.ReqID)
	}
	return in, ok, taken
}

// AnswerInbound applies the host's answers to an Evaluate item. While the
// lock stays held, the answer to the Evaluate handed out last is queued
// instead and the lookup reported unfinished: a Finish item follows once
// it is over (hostgate.go).
func (t *Tier) AnswerInbound(lookupID int64, results []LookupResult, pinJobID int64, pinSlots []int64) (bool, error) {
	rows, err := t.checkSlots(pinSlots)
	if err != nil {
		return false, err
	}
	answers, err := inboundAnswers(results)
	if err != nil {
		return false, err
	}
	a := queuedAnswer{lookupID: lookupID, answers: answers, pinJobID: pinJobID, rows: rows}
	if !t.lockForHost(false) {
		if t.gate.queueAnswer(a) {
			t.book.wakeRegister() // the loop applies it
			return false, nil
		}
		t.lockHost() // not the Evaluate handed out last, or the queue is full: wait
	}
	defer t.unlockHost()
	if err := t.life.usable(); err != nil {
		return true, err
	}
	return t.answerInbound(a)
}

// inboundAnswers is the host's results as the session takes them.
func inboundAnswers(results []LookupResult) ([]session.Answer, error) {
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
			return nil, fmt.Errorf("%w: results[%d]=%d is not a lookup result", ErrInvalidArgument, i, r)
		}
	}
	return answers, nil
}

// answerInbound applies a; t.mu held, the tier usable.
func (t *Tier) answerInbound(a queuedAnswer) (bool, error) {
	l := t.desk.lookup(a.lookupID)
	if l != nil && !l.CheckedOut() {
		return false, fmt.Errorf("%w: lookup %d was not handed out for evaluation", ErrInvalidArgument, a.lookupID)
	}
	pins := len(a.rows) > 0
	if pins {
		if err := t.ledger.mayAdmit(a.pinJobID); err != nil {
			return false, err
		}
	}
	if l == nil {
		// Dropped while the host evaluated it: release the pins now.
		if pins {
			t.admitPins(a.pinJobID)
			t.ledger.report(a.pinJobID, false, 0)
		}
		return true, nil
	}
	finished, err := l.Session().AnswerLookup(l, a.answers, a.pinJobID, a.rows)
	if err != nil { // nothing changed: the lookup stays checked out, no job was admitted
		return false, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	if pins {
		// Admitted once the answer holds (a job is deleted only by its
		// report); its report comes from the session, applied in settle.
		t.admitPins(a.pinJobID)
	}
	t.desk.answered(l, finished)
	t.settle()
	return finished, nil
}

// applyQueuedAnswers applies the answers host calls queued while they did
// without the lock, in order; t.mu held. The host was told each lookup is
// not finished, so one that is (or cannot take the answer) gets a Finish
// item; the pins of an answer not taken are released (reported failed).
func (t *Tier) applyQueuedAnswers(answers []queuedAnswer) {
	for _, a := range answers {
		usable := t.life.usable() == nil
		finished, err := true, error(nil)
		if usable {
			finished, err = t.answerInbound(a)
		}
		if err != nil {
			t.logf("ERROR", "the host's answer to inbound lookup %d, made while the node was busy, was not taken: %v", a.lookupID, err)
		}
		if (err != nil || !usable) && len(a.rows) > 0 && t.ledger.mayAdmit(a.pinJobID) == nil {
			t.admitPins(a.pinJobID)
			t.ledger.report(a.pinJobID, false, 0)
		}
		if usable && (finished || err != nil) {
			t.desk.queue(inboundItem{id: a.lookupID, kind: InboundFinish, reqID: a.reqID}, false)
		}
	}
}

// admitPins records the store job that holds an answer's pinned rows;
// AnswerInbound checked it may be admitted.
func (t *Tier) admitPins(jobID int64) {
	if _, err := t.ledger.admit(jobID, false); err != nil {
		t.logf("ERROR", "internal: %v", err)
	}
}

package tier

import "github.com/peerkv/peerkv/core/session"

// settle is the one step after every call into sessions: it applies their
// reports in order (applying one may call a session again, which may report
// more), then forgets the sessions that ended. Called with t.mu held.
func (t *Tier) settle() {
	for {
		for r, ok := t.intake.nextReport(); ok; r, ok = t.intake.nextReport() {
			t.apply(r)
		}
		t.book.refreshStale() // may register and send lookups, which may report
		if t.intake.hasReports() {
			continue
		}
		if ended, _ := t.teardown(endReaped); ended == 0 {
			return
		}
	}
}

func (t *Tier) apply(r session.Report) {
	if r.Kind == session.LoadDone {
		var now bool
		if r, now = t.checkRows(r); !now {
			return // its report comes back checked (verify.go)
		}
	}
	t.applyChecked(r)
}

// applyChecked applies a report that needs no (more) check.
func (t *Tier) applyChecked(r session.Report) {
	t.observeReport(r)
	switch r.Kind {
	case session.LoadDone:
		t.book.loadDone(r.Session, r)
	case session.StoreDone:
		t.ledger.report(r.JobID, r.OK, r.Bytes)
	case session.ConsumerFailed:
		t.book.sourceFailed(r.Session, r.KVID, "its session ended with lookups unanswered")
	case session.Ended:
		t.peers.endedSession(r.Session)
	case session.ProbesAnswered:
		t.book.probesAnswered(r.Session, r.KVID)
	case session.FetchArrived:
		t.desk.fetchArrived(r.Session, r.KVID)
	case session.InboundReady:
		t.desk.inboundReady(r.Lookup)
	case session.InboundFinished:
		t.desk.inboundFinished(r.Lookup)
	}
}

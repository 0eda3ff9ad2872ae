package tier

import "github.com/peerkv/peerkv/core/session"

// ending says how the one teardown ends sessions.
type ending int

const (
	// endReaped: the sessions that reported their end (settle); the tier
	// goes on.
	endReaped ending = iota
	// endShutdown: every session, each closed with a goodbye; the tier
	// stops (Shutdown).
	endShutdown
	// endPoisoned: every session dropped, NOT closed; the tier stops
	// (poison). A panic left the tier's state, and maybe the sessions',
	// unknown, and closing one runs its code on that state (it reports its
	// jobs, sends a goodbye); the jobs are failed here instead.
	endPoisoned
)

// teardown is the one path by which sessions end: peerSet ends them (reap,
// closeAll or drop; it alone forgets a session) and returns them, and each
// other owner forgets what it held for them. When the tier stops, every
// owner is cleared as well, and every job still in flight is reported
// failed. t.mu held. It returns how many sessions ended and, at shutdown,
// how many refused peers were still said the goodbye they were owed.
func (t *Tier) teardown(how ending) (ended, goodbyes int) {
	var gone []*session.Session
	switch how {
	case endReaped:
		gone = t.peers.reap()
	case endShutdown:
		gone = t.peers.closeAll("shutting down")
	case endPoisoned:
		gone = t.peers.drop()
	}
	for _, s := range gone {
		t.purge(s, how)
	}
	if how == endReaped {
		return len(gone), 0
	}
	// The tier stops.
	if how == endShutdown {
		goodbyes = t.peers.sayOwedGoodbyes() // refused stock peers still waiting for theirs
		t.logf("INFO", "shutting down: %d session(s) closed, %d job(s) still in flight reported failed", len(gone), t.ledger.inFlight())
		t.settle() // what the sessions reported as they closed
	} else {
		t.intake.dropReports() // the reports of sessions in an unknown state
	}
	t.ledger.failAll() // parked stores included
	if how == endPoisoned {
		t.book.guard.revokeAll() // no peer may write our rows any more
	}
	t.desk.clear()
	return len(gone), goodbyes
}

// purge has every owner but peerSet forget what it held for s, which
// ended as how says. When the tier stops, the owners are cleared whole
// instead (teardown).
func (t *Tier) purge(s *session.Session, how ending) {
	switch how {
	case endReaped:
		if c := s.RejectCause(); c != "" && !s.Probe() { // a probe's refusal is the answer it asked for
			t.telemetry.rejected(c)
		}
		t.book.purge(s) // its pulls' answers may change without it
		t.desk.purge(s)
	case endShutdown:
		t.desk.purge(s)
	}
}

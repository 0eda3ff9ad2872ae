package tier

import (
	"fmt"
	"iter"
	"time"
)

// job is a submitted job not yet reported.
type job struct {
	isLoad bool
	at     time.Time
}

// ledger owns the host's jobs from submission to their one result, and the
// results the host has not collected yet. report is the only deleter of a
// job and the one place a result is queued, so each job is reported exactly
// once. It has no deadline of its own: each job's deadline belongs to what
// reports it (a load, a parked store, a session). Owned under t.mu.
type ledger struct {
	jobs     map[int64]*job
	finished []JobResult // in the order reported; GetFinished drains the head

	now  func() time.Time
	logf Logf
	// counts: the loads and stores that ended, and their bytes; the ledger
	// is the only writer of those counters.
	counts *counters
	// reported is told each result once it is queued, to time loads and to
	// tell the host there is something to collect.
	reported func(JobResult)
}

func newLedger(now func() time.Time, logf Logf, counts *counters, reported func(JobResult)) *ledger {
	return &ledger{jobs: map[int64]*job{}, now: now, logf: logf, counts: counts, reported: reported}
}

// mayAdmit says why jobID cannot be submitted now (nil if it can).
func (l *ledger) mayAdmit(jobID int64) error {
	if _, dup := l.jobs[jobID]; dup {
		return fmt.Errorf("%w: job %d is already in flight", ErrDuplicate, jobID)
	}
	return nil
}

// admit records a newly submitted job.
func (l *ledger) admit(jobID int64, isLoad bool) (*job, error) {
	if err := l.mayAdmit(jobID); err != nil {
		return nil, err
	}
	j := &job{isLoad: isLoad, at: l.now()}
	l.jobs[jobID] = j
	return j, nil
}

// all is every job in flight; a job reported while it runs is not visited
// after that.
func (l *ledger) all() iter.Seq2[int64, *job] {
	return func(yield func(int64, *job) bool) {
		for id, j := range l.jobs {
			if !yield(id, j) {
				return
			}
		}
	}
}

// report delivers a job's single outcome to the host.
func (l *ledger) report(jobID int64, ok bool, bytes int64) {
	j := l.jobs[jobID]
	if j == nil {
		l.logf("ERROR", "internal: job %d reported twice or never submitted (ignored)", jobID)
		return
	}
	delete(l.jobs, jobID)
	l.count(j.isLoad, ok, bytes)
	r := JobResult{JobID: jobID, Success: ok, IsLoad: j.isLoad, Bytes: bytes, Duration: l.now().Sub(j.at)}
	l.finished = append(l.finished, r)
	l.reported(r)
}

func (l *ledger) count(isLoad, ok bool, bytes int64) {
	c := l.counts
	switch {
	case isLoad && ok:
		c.loadsOK++
		c.bytesIn += bytes
	case isLoad:
		c.loadsFailed++
	case ok:
		c.storesOK++
		c.bytesOut += bytes
	default:
		c.storesFailed++
	}
}

// failAll reports every job still in flight failed: the peer stops (a
// shutdown, or poisoned), and the host must not wait for any of them.
func (l *ledger) failAll() {
	for id := range l.jobs {
		l.report(id, false, 0)
	}
}

// take moves up to max results out, oldest first.
func (l *ledger) take(max int) []JobResult {
	if max <= 0 || len(l.finished) == 0 {
		return nil
	}
	n := min(max, len(l.finished))
	out := make([]JobResult, n)
	copy(out, l.finished)
	l.finished = append(l.finished[:0], l.finished[n:]...)
	return out
}

// inFlight counts the jobs not reported yet.
func (l *ledger) inFlight() int { return len(l.jobs) }

// unreported counts the results the host has not collected yet.
func (l *ledger) unreported() int { return len(l.finished) }

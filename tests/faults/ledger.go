package faults

import (
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/peerkv/peerkv/core/tier"
)

var jobSeq atomic.Int64

// NextJob returns a job id no other job of this process uses.
func NextJob() int64 { return jobSeq.Add(1) }

// Ledger records every job submitted to any peer and every report, so
// that a job reported twice, reported without being submitted, or never
// reported is found.
type Ledger struct {
	mu       sync.Mutex
	jobs     map[int64]*entry
	done     map[int64]struct{} // reported jobs Compact forgot the details of
	problems []string
}

type entry struct {
	peer, what string
	reported   bool
	at         time.Time // when reported
	result     tier.JobResult
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger { return &Ledger{jobs: map[int64]*entry{}, done: map[int64]struct{}{}} }

// Compact drops what it keeps of jobs reported over age ago but their ids
// (a long run would otherwise grow the heap it measures); Result no longer
// finds them.
func (l *Ledger) Compact(age time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id, e := range l.jobs {
		if e.reported && time.Since(e.at) > age {
			l.done[id] = struct{}{}
			delete(l.jobs, id)
		}
	}
}

// Submit records a job before the call that submits it (a report can
// arrive before that call returns).
func (l *Ledger) Submit(peer string, id int64, what string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.jobs[id] = &entry{peer: peer, what: what}
}

// Withdraw forgets a job whose submission was refused.
func (l *Ledger) Withdraw(id int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.jobs, id)
}

// Collect takes every finished job from t, recording problems.
func (l *Ledger) Collect(peer string, t *tier.Tier) {
	for {
		rs := t.GetFinished(4096)
		if len(rs) == 0 {
			return
		}
		l.mu.Lock()
		for _, r := range rs {
			e := l.jobs[r.JobID]
			_, done := l.done[r.JobID]
			switch {
			case done:
				l.problems = append(l.problems, fmt.Sprintf("%s reported job %d twice", peer, r.JobID))
			case e == nil:
				l.problems = append(l.problems, fmt.Sprintf("%s reported job %d, which was never submitted", peer, r.JobID))
			case e.reported:
				l.problems = append(l.problems, fmt.Sprintf("%s reported job %d (%s) twice", peer, r.JobID, e.what))
			default:
				e.reported, e.result, e.at = true, r, time.Now()
			}
		}
		l.mu.Unlock()
	}
}

// Result returns a job's report, if it came.
func (l *Ledger) Result(id int64) (tier.JobResult, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.jobs[id]
	if e == nil || !e.reported {
		return tier.JobResult{}, false
	}
	return e.result, true
}

// ReportedAt returns when a job's report was collected, if it came.
func (l *Ledger) ReportedAt(id int64) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e := l.jobs[id]
	if e == nil || !e.reported {
		return time.Time{}, false
	}
	return e.at, true
}

// Wait polls for a job's report up to within, calling pump (if any) before
// each look.
func (l *Ledger) Wait(id int64, within time.Duration, pump func()) (tier.JobResult, bool) {
	deadline := time.Now().Add(within)
	for {
		if pump != nil {
			pump()
		}
		if r, ok := l.Result(id); ok {
			return r, true
		}
		if time.Now().After(deadline) {
			return tier.JobResult{}, false
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Problems lists duplicate and unknown reports so far.
func (l *Ledger) Problems() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.problems...)
}

// Unreported lists the jobs submitted and not reported yet.
func (l *Ledger) Unreported() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for id, e := range l.jobs {
		if !e.reported {
			out = append(out, fmt.Sprintf("%s job %d (%s)", e.peer, id, e.what))
		}
	}
	sort.Strings(out)
	return out
}

// Counts returns how many jobs were submitted and how many reported.
func (l *Ledger) Counts() (submitted, reported int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	submitted, reported = len(l.done), len(l.done)
	for _, e := range l.jobs {
		submitted++
		if e.reported {
			reported++
		}
	}
	return submitted, reported
}

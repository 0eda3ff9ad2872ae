package tier

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ledgerClock is a clock the test moves.
type ledgerClock struct{ at time.Time }

func newLedgerClock() *ledgerClock             { return &ledgerClock{at: time.Unix(1_790_000_000, 0)} }
func (c *ledgerClock) now() time.Time          { return c.at }
func (c *ledgerClock) advance(d time.Duration) { c.at = c.at.Add(d) }

// ledgerLog records the lines logged.
type ledgerLog struct{ lines []string }

func (f *ledgerLog) logf(level, format string, args ...any) {
	f.lines = append(f.lines, level+" "+fmt.Sprintf(format, args...))
}

// matching returns the lines that contain every part.
func (f *ledgerLog) matching(parts ...string) []string {
	var out []string
	for _, l := range f.lines {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(l, p)
		}
		if all {
			out = append(out, l)
		}
	}
	return out
}

// ledgerHarness is a ledger with a fake clock and log, and what it told
// its owner.
type ledgerHarness struct {
	*ledger
	clock  *ledgerClock
	log    *ledgerLog
	counts *counters
	told   []JobResult // what reported was told, in order
}

func newLedgerHarness() *ledgerHarness {
	h := &ledgerHarness{clock: newLedgerClock(), log: &ledgerLog{}, counts: &counters{}}
	h.ledger = newLedger(h.clock.now, h.log.logf, h.counts, func(r JobResult) { h.told = append(h.told, r) })
	return h
}

func (h *ledgerHarness) mustAdmit(t *testing.T, jobID int64, isLoad bool) {
	t.Helper()
	_, err := h.admit(jobID, isLoad)
	require.NoError(t, err)
}

func TestALedgerReportsAJobOnceAndRefusesASecondReportWithOneErrorLine(t *testing.T) {
	h := newLedgerHarness()
	h.mustAdmit(t, 1, true)
	_, err := h.admit(1, false)
	require.ErrorIs(t, err, ErrDuplicate, "a job id in flight cannot be submitted again")

	h.clock.advance(2 * time.Second)
	h.report(1, true, 4096)
	h.report(1, false, 0) // a second outcome of the same job

	want := JobResult{JobID: 1, Success: true, IsLoad: true, Bytes: 4096, Duration: 2 * time.Second}
	assert.Equal(t, []JobResult{want}, h.take(10), "the host sees the first outcome only")
	assert.Equal(t, []JobResult{want}, h.told, "the owner is told once")
	assert.Len(t, h.log.matching("ERROR", "job 1 reported twice"), 1, "the second report is logged once")
	assert.Equal(t, counters{loadsOK: 1, bytesIn: 4096}, *h.counts, "counted once, as a success")
	assert.Equal(t, 0, h.inFlight())

	h.report(9, true, 1) // never submitted
	assert.Empty(t, h.take(10))
	assert.Len(t, h.log.matching("ERROR", "job 9 reported twice or never submitted"), 1)
	assert.Equal(t, counters{loadsOK: 1, bytesIn: 4096}, *h.counts)
}

func TestLedgerResultsAreDrainedInTheOrderReported(t *testing.T) {
	h := newLedgerHarness()
	for id := int64(1); id <= 5; id++ {
		h.mustAdmit(t, id, id%2 == 0)
	}
	for _, id := range []int64{3, 1, 5, 2, 4} {
		h.clock.advance(time.Second)
		h.report(id, id != 5, 10*id)
	}
	assert.Nil(t, h.take(0), "max <= 0 takes nothing")
	assert.Equal(t, 5, h.unreported())

	ids := func(rs []JobResult) []int64 {
		out := make([]int64, len(rs))
		for i, r := range rs {
			out[i] = r.JobID
		}
		return out
	}
	first := h.take(2)
	assert.Equal(t, []int64{3, 1}, ids(first))
	assert.Equal(t, 2*time.Second, first[1].Duration, "timed from submission to report")
	assert.Equal(t, []int64{5, 2, 4}, ids(h.take(10)))
	assert.Nil(t, h.take(10), "drained")
	assert.Equal(t, counters{loadsOK: 2, bytesIn: 60, storesOK: 2, bytesOut: 40, storesFailed: 1}, *h.counts)
}

// The peer's end (shutdown, poison) fails every job in flight exactly once,
// and an outcome arriving afterwards (a load settling late) changes nothing.
func TestFailingAllJobsReportsEachOnceAndLateOutcomesAreRefused(t *testing.T) {
	h := newLedgerHarness()
	h.mustAdmit(t, 1, true)
	h.mustAdmit(t, 2, false)
	h.mustAdmit(t, 3, true)
	h.report(2, true, 8)

	h.failAll()
	h.failAll() // a second teardown finds nothing left
	h.report(3, true, 64)

	results := h.take(10)
	require.Len(t, results, 3)
	assert.Equal(t, JobResult{JobID: 2, Success: true, Bytes: 8}, results[0])
	failed := map[int64]bool{}
	for _, r := range results[1:] {
		assert.False(t, r.Success)
		assert.True(t, r.IsLoad)
		assert.False(t, failed[r.JobID], "job %d failed twice", r.JobID)
		failed[r.JobID] = true
	}
	assert.Equal(t, map[int64]bool{1: true, 3: true}, failed)
	assert.Len(t, h.told, 3)
	assert.Len(t, h.log.matching("ERROR", "job 3 reported twice"), 1)
	assert.Equal(t, counters{loadsFailed: 2, storesOK: 1, bytesOut: 8}, *h.counts)
	assert.Equal(t, 0, h.inFlight())
}

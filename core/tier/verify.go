package tier

import (
	"sync"
	"sync/atomic"

	"github.com/peerkv/peerkv/core/data/rowsum"
	"github.com/peerkv/peerkv/core/session"
)

// Integrity failure causes (stats integrity_failures, the metric's cause
// label): a landed row whose checksum is not the producer's, or a
// successful transfer_done without a checksum for each row.
const (
	IntegrityMismatch = "mismatch"
	IntegrityMissing  = session.IntegrityMissing
)

// IntegrityCauses lists every cause, in documentation order.
var IntegrityCauses = []string{IntegrityMismatch, IntegrityMissing}

// checker holds the checks of verified loads under way, which read the
// region off the lock.
type checker struct {
	done    chan checked   // checks back to the loop (verdict)
	running sync.WaitGroup // checks reading the region; Shutdown waits (the host may free it after)
	reread  atomic.Int64   // rows checked by reading them again (not by their landed sums)
	// before, if set (tests), runs before a verified load's rows are
	// checked, on the checking goroutine.
	before func(rows []uint64)
}

// checked is a verified load's report with the outcome of its check.
type checked struct {
	r   session.Report
	bad int // index of the first row that failed, -1 if none
}

// checkRows takes a session's LoadDone. A successful load of a verified
// pull is checked where its rows landed before anything reports it, on a
// goroutine (a large load's check takes milliseconds; the host's calls
// must not wait for it): its report comes back through the progress loop
// (verdict). Until then the load's rows stay owed to the peer and in no
// one else's hands. Other reports, and a load the session already failed
// for its sums (r.Integrity), go on at once. t.mu held.
func (t *Tier) checkRows(r session.Report) (session.Report, bool) {
	if r.Integrity != "" {
		return t.integrityFailed(r, -1), true
	}
	if !r.OK || r.Sums == nil {
		return r, true
	}
	hook := t.checks.before
	t.checks.running.Add(1)
	go func() {
		defer t.checks.running.Done()
		if hook != nil {
			hook(r.Rows)
		}
		bad := t.mismatch(r.Rows, r.Sums)
		select {
		case t.checks.done <- checked{r, bad}:
		case <-t.life.stop:
		}
	}()
	return r, false
}

// mismatch returns the index of the first of rows whose bytes are not what
// sums say, or -1. A row summed as it landed through the row guard, in a
// region no one can write around the guard, is checked by that sum (the
// guard hands the sums over once every copy under way is over); any other
// row is read again, after every copy made so far.
func (t *Tier) mismatch(rows []uint64, sums []uint64) int {
	landed, have := t.book.guard.landedSums(rows)
	unguarded := landedUnguarded(t.dt)
	var reread []int // indexes into rows
	bad := -1
	for i := range rows {
		switch {
		case unguarded || !have[i]:
			reread = append(reread, i)
		case landed[i] != sums[i] && bad < 0:
			bad = i
		}
	}
	t.checks.reread.Add(int64(len(reread)))
	if len(reread) == 0 {
		return bad
	}
	rrows, rsums := make([]uint64, len(reread)), make([]uint64, len(reread))
	for j, i := range reread {
		rrows[j], rsums[j] = rows[i], sums[i]
	}
	if j := rowsum.Mismatch(t.region, rrows, rsums); j >= 0 && (bad < 0 || reread[j] < bad) {
		bad = reread[j]
	}
	return bad
}

// verdict applies a check's outcome: the report as the session made it,
// or failed. t.mu held (locked settles what it leads to).
func (t *Tier) verdict(c checked) {
	r := c.r
	r.Sums = nil
	if c.bad >= 0 {
		r = t.integrityFailed(r, c.bad)
	}
	t.applyChecked(r)
}

// integrityFailed fails a load that did not pass (bad: its first bad row,
// or -1 when its sums were missing): counted by cause and path, logged
// with peer, kv id and row, and its peer fenced, as a failed transfer's is.
func (t *Tier) integrityFailed(r session.Report, bad int) session.Report {
	peer := r.Session.PeerID()
	if bad >= 0 {
		r.Integrity = IntegrityMismatch
		t.stats.integrityMismatch++
		t.logf("WARNING", "peer %s: kv_request_id=%s round=%d: row %d (key %d of %d) does not match the checksum the peer sent; the load fails",
			peer, r.KVID, r.Round, r.Rows[bad], bad, len(r.Rows))
	} else {
		t.stats.integrityMissing++
		t.logf("WARNING", "peer %s: kv_request_id=%s round=%d: transfer_done carries no checksum for each of its %d rows although both sides verify pulls; the load fails",
			peer, r.KVID, r.Round, len(r.Rows))
	}
	r.OK, r.Fence, r.Sums = false, true, nil
	t.obs.path(t.peers.pathOf(r.Session)).IntegrityFailures++
	return r
}

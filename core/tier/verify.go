package tier

import (
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

// checkRows verifies a successful load of a verified pull where its rows
// landed, before anything reports it: a row that differs from the sum the
// producer took when it sent it fails the load (the keys go to another
// source, or the request recomputes). The check holds the write guard's
// lock, so no write of the data path runs into the rows meanwhile. A
// failed check fences the peer, as a failed transfer does. t.mu held.
func (t *Tier) checkRows(r session.Report) session.Report {
	if r.Integrity == "" && (!r.OK || r.Sums == nil) {
		return r
	}
	peer := r.Session.PeerID()
	if r.Integrity == "" {
		if t.beforeCheck != nil {
			t.beforeCheck(r.Rows)
		}
		t.guardMu.Lock()
		bad := rowsum.Mismatch(t.region, r.Rows, r.Sums)
		t.guardMu.Unlock()
		if bad < 0 {
			return r
		}
		r.Integrity = IntegrityMismatch
		t.logf("WARNING", "peer %s: kv_request_id=%s round=%d: row %d (key %d of %d) does not match the checksum the peer sent; the load fails",
			peer, r.KVID, r.Round, r.Rows[bad], bad, len(r.Rows))
	} else {
		t.logf("WARNING", "peer %s: kv_request_id=%s round=%d: transfer_done carries no checksum for each of its %d rows although both sides verify pulls; the load fails",
			peer, r.KVID, r.Round, len(r.Rows))
	}
	r.OK, r.Fence, r.Sums = false, true, nil
	if r.Integrity == IntegrityMismatch {
		t.stats.integrityMismatch++
	} else {
		t.stats.integrityMissing++
	}
	t.obs.path(t.obs.pathOf(r.Session)).IntegrityFailures++
	return r
}

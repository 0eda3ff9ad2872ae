package tier

import (
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/session"
)

// settle is the one step after every call into sessions: it applies their
// reports in order (applying one may call a session again, which may report
// more), then forgets the sessions that ended. Called with t.mu held.
func (t *Tier) settle() {
	for {
		for len(t.pending) > 0 {
			r := t.pending[0]
			t.pending = t.pending[1:]
			t.apply(r)
		}
		t.pending = nil
		if !t.reapDead() {
			return
		}
	}
}

func (t *Tier) apply(r session.Report) {
	switch r.Kind {
	case session.LoadDone:
		j := t.jobs[r.JobID]
		if j != nil {
			if r.Fence && j.peer != "" {
				// Cut the peer's writes in flight before the host gets these
				// rows back for a newer load.
				if f, ok := t.dt.(data.Fencer); ok {
					f.Fence(j.peer)
				}
			}
			t.expect(j.peer, r.Rows, false)
			if !r.OK && j.req != nil {
				j.req.failed = true // this request recomputes; a later one reusing the kv id starts clean
			}
		}
		var bytes int64
		if r.OK {
			bytes = int64(len(r.Rows)) * int64(t.region.RowLen)
		}
		t.report(r.JobID, r.OK, bytes)
	case session.StoreDone:
		t.report(r.JobID, r.OK, r.Bytes)
	case session.ConsumerFailed:
		for _, req := range t.requests {
			if src := req.source; src != nil && src.KVRequestID == r.KVID && src.PeerID() == r.Session.PeerID() {
				req.failed = true
			}
		}
	case session.FetchArrived:
		t.fetchArrived(r.Session, r.KVID)
	case session.InboundReady:
		t.lookups[r.Lookup.ID] = r.Lookup
		t.queueInbound(inboundItem{id: r.Lookup.ID, kind: InboundEvaluate}, false)
		t.stats.inboundLookups++
	case session.InboundFinished:
		l := r.Lookup
		delete(t.lookups, l.ID) // its queued Evaluate item, if any, is skipped when reached
		if l.OwesFinish() {
			t.queueInbound(inboundItem{id: l.ID, kind: InboundFinish, reqID: l.ReqID}, false)
		}
	}
}

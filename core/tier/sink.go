package tier

import "github.com/peerkv/peerkv/core/session"

// sink is how sessions report to the tier; called with t.mu held.
type sink struct{ t *Tier }

func (k sink) LoadDone(jobID int64, ok bool, kvID string, rows []uint64) {
	t := k.t
	j := t.jobs[jobID]
	if j != nil {
		t.expect(j.peer, rows, false)
		if !ok && j.req != nil {
			j.req.failed = true // this request recomputes; a later one reusing the kv id starts clean
		}
	}
	var bytes int64
	if ok {
		bytes = int64(len(rows)) * int64(t.region.RowLen)
	}
	t.report(jobID, ok, bytes)
}

func (k sink) StoreDone(jobID int64, ok bool, bytes int64) { k.t.report(jobID, ok, bytes) }

func (k sink) ConsumerFailed(s *session.Session, kvID string) {
	for _, r := range k.t.requests {
		if src := r.source; src != nil && src.KVRequestID == kvID && src.PeerID() == s.PeerID() {
			r.failed = true
		}
	}
}

func (k sink) FetchArrived(s *session.Session, kvID string) { k.t.fetchArrived(s, kvID) }

func (k sink) InboundReady(l *session.InboundLookup) {
	k.t.lookups[l.ID] = l
	k.t.inbound.push(inboundItem{id: l.ID, kind: InboundEvaluate})
	k.t.stats.inboundLookups++
}

func (k sink) InboundFinished(l *session.InboundLookup) {
	t := k.t
	delete(t.lookups, l.ID)
	t.inbound.remove(l.ID)
	if l.Evaluated && !l.CheckedOut {
		t.inbound.push(inboundItem{id: l.ID, kind: InboundFinish, reqID: l.ReqID})
	}
}

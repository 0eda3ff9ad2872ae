package tier

import "github.com/peerkv/peerkv/core/session"

// sink is how sessions report to the tier; called with t.mu held.
type sink struct{ t *Tier }

func (k sink) LoadDone(jobID int64, ok bool, kvID string, rows []uint64) {
	t := k.t
	if j := t.jobs[jobID]; j != nil {
		t.expect(j.peer, rows, false)
	}
	var bytes int64
	if ok {
		bytes = int64(len(rows)) * int64(t.region.RowLen)
	}
	t.report(jobID, ok, bytes)
}

func (k sink) StoreDone(jobID int64, ok bool, bytes int64) { k.t.report(jobID, ok, bytes) }

func (k sink) ConsumerFailed(kvID string) { k.t.failedKV[kvID] = struct{}{} }

// FetchArrived binds the kv id to the session and hands it the batches the
// prefill stored before the decoder asked.
func (k sink) FetchArrived(s *session.Session, kvID string) {
	t := k.t
	if _, gone := t.reaped[kvID]; gone {
		// Its stores were already released: fail the round now instead of
		// letting the decoder wait for its load timeout.
		s.FinishProducer(kvID)
		return
	}
	t.kvSession[kvID] = s
	batches := t.unbound[kvID]
	delete(t.unbound, kvID)
	for _, b := range batches {
		s.AddStoredBlocks(kvID, b.keys, b.rows, b.jobID, 0, false)
	}
	if _, done := t.finishedKV[kvID]; done {
		// The prefill request already ended: nothing more will be stored.
		delete(t.finishedKV, kvID)
		delete(t.kvSession, kvID)
		s.FinishProducer(kvID)
	}
}

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

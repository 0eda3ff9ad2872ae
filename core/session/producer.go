package session

import (
	"errors"
	"fmt"
	"time"

	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/data/rowsum"
	"github.com/peerkv/peerkv/core/protocol"
)

// transfer is one data-path write in flight.
type transfer struct {
	kvID  string
	round uint64
	r     *round
	rows  int
	dst   []uint64      // the consumer's rows it writes (for their sums)
	sums  []uint64      // its source rows' sums, when taken at the start
	jobs  map[int64]int // job -> rows it contributes
}

// storeJob is a host job whose rows the producer holds pinned.
type storeJob struct {
	at      time.Time
	kvID    string
	round   uint64
	written int // rows written to the peer
	carried int // transfers in flight reading its rows
}

// producer is the role that serves rows to the peer.
type producer struct {
	link
	requests  map[string]*producerRequest
	held      holdings // over requests, kept by holdings.go
	transfers map[uint64]*transfer
	jobs      map[int64]*storeJob
}

func newProducer(l link) producer {
	return producer{link: l, requests: map[string]*producerRequest{}, transfers: map[uint64]*transfer{},
		jobs: map[int64]*storeJob{}}
}

func (p *producer) busy() bool {
	if len(p.transfers) > 0 || len(p.jobs) > 0 {
		return true
	}
	for _, r := range p.requests {
		if len(r.lookups) > 0 {
			return true
		}
	}
	return false
}

func (p *producer) request(id string) *producerRequest {
	r := p.requests[id]
	if r == nil {
		p.held.all = p.env.Keys
		r = newProducerRequest(&p.held)
		p.requests[id] = r
		p.engaged()
	}
	return r
}

func (p *producer) round(id string, seq uint64) *round { return p.request(id).round(seq) }

// prune drops a request once it holds no round and no lookup; tombstones
// keep it until expireRounds forgets them.
func (p *producer) prune(id string) {
	if req := p.requests[id]; req != nil && len(req.lookups) == 0 && len(req.rounds) == 0 {
		delete(p.requests, id)
	}
}

// addStored adds rows the host stored (PD, round 0) or pinned for a
// lookup (its round) as supply, writing at once what is already demanded.
func (p *producer) addStored(kvID string, keys [][]byte, rows []uint64, jobID int64, roundSeq uint64, fromLookup bool) {
	r := p.round(kvID, roundSeq)
	if !r.live() || p.ended() {
		p.report(Report{Kind: StoreDone, JobID: jobID})
		return
	}
	p.jobs[jobID] = &storeJob{at: p.env.Now(), kvID: kvID, round: roundSeq}
	r.addJob(jobID, fromLookup)
	var local, remote []uint64
	for i, k := range keys {
		if dst, ok := r.takeWanted(string(k)); ok {
			local = append(local, rows[i])
			remote = append(remote, dst)
		} else {
			r.offer(string(k), supply{job: jobID, row: rows[i]})
		}
	}
	if len(local) > 0 && r.state == roundFetched {
		p.write(kvID, roundSeq, r, local, remote, map[int64]int{jobID: len(local)})
	}
}

func (p *producer) onFetch(m *protocol.Fetch) error {
	r := p.requests[m.KVRequestID]
	if r != nil {
		if rd := r.rounds[m.RoundSeq]; rd != nil && rd.fetchSeen {
			return fmt.Errorf("duplicate fetch for kv_request_id=%s round=%d", m.KVRequestID, m.RoundSeq)
		}
	}
	if m.IsTerminal() {
		p.dropLookups(m.KVRequestID)
		if req := p.requests[m.KVRequestID]; req != nil {
			for _, seq := range sortedRounds(req.rounds) {
				p.finalize(m.KVRequestID, seq, false)
			}
		}
		p.prune(m.KVRequestID)
		return nil
	}
	if why := p.overCap(m.KVRequestID, len(m.Keys)); why != "" {
		p.env.Logf("WARNING", "peer %s: fetch kv_request_id=%s round=%d refused: %s",
			p.peerID, m.KVRequestID, m.RoundSeq, why)
		p.send(&protocol.TransferDone{KVRequestID: m.KVRequestID, Success: false, RoundSeq: m.RoundSeq})
		return nil
	}
	rd := p.round(m.KVRequestID, m.RoundSeq)
	rd.fetch(p.env.Now(), len(m.Keys))
	if p.verifies() {
		rd.verify(m.BlockIndexes)
	}
	if bad := p.badFetch(m); bad != "" {
		p.env.Logf("ERROR", "peer %s: fetch kv_request_id=%s round=%d rejected: %s",
			p.peerID, m.KVRequestID, m.RoundSeq, bad)
		rd.closeSupply()
		p.finalize(m.KVRequestID, m.RoundSeq, true)
		return nil
	}
	var local, remote []uint64
	jobs := map[int64]int{}
	for i, k := range m.Keys {
		if sup, ok := rd.takeSupply(string(k)); ok {
			local = append(local, sup.row)
			remote = append(remote, m.BlockIndexes[i])
			jobs[sup.job]++
		} else {
			rd.want(string(k), m.BlockIndexes[i])
		}
	}
	switch {
	case rd.fromLookup && len(rd.wanted) > 0:
		p.env.Logf("WARNING", "peer %s: fetch kv_request_id=%s round=%d asks for %d keys it was not promised; failing the round",
			p.peerID, m.KVRequestID, m.RoundSeq, len(rd.wanted))
		rd.closeSupply()
		if len(local) == 0 {
			p.finalize(m.KVRequestID, m.RoundSeq, true)
			return nil
		}
	case !rd.live():
		p.finalize(m.KVRequestID, m.RoundSeq, true) // aborted earlier: tell the consumer at once
		return nil
	}
	if len(local) > 0 {
		p.write(m.KVRequestID, m.RoundSeq, rd, local, remote, jobs)
	} else if rd.supplyClosed && rd.inflight == 0 {
		p.finalize(m.KVRequestID, m.RoundSeq, true)
	}
	if !rd.fromLookup {
		p.report(Report{Kind: FetchArrived, KVID: m.KVRequestID})
	}
	return nil
}

// badFetch checks what vLLM's validator does not: consumer rows inside the
// region the consumer advertised, and no key asked twice.
func (p *producer) badFetch(m *protocol.Fetch) string {
	limit := p.peerRows()
	seen := make(map[string]struct{}, len(m.Keys))
	for i, row := range m.BlockIndexes {
		if row >= limit {
			return fmt.Sprintf("block_indexes[%d]=%d is outside the consumer's %d rows", i, row, limit)
		}
		if _, dup := seen[string(m.Keys[i])]; dup {
			return fmt.Sprintf("keys[%d] is asked twice", i)
		}
		seen[string(m.Keys[i])] = struct{}{}
	}
	return ""
}

func (p *producer) onAbortFetch(m *protocol.AbortFetch) {
	req := p.requests[m.KVRequestID]
	var r *round
	if req != nil {
		r = req.rounds[m.RoundSeq]
	}
	if r == nil {
		// Nothing of that round here (finished, or never started): tombstone it
		// so late supply is refused (unless the peer already holds its share
		// of our state), and confirm at once.
		if p.overCap(m.KVRequestID, 0) == "" {
			p.round(m.KVRequestID, m.RoundSeq).kill(p.env.Now(), false)
		}
		p.send(&protocol.AbortAck{KVRequestID: m.KVRequestID, RoundSeq: m.RoundSeq})
		return
	}
	if r.abort(p.env.Now()) {
		p.releaseUncarried(r, false)
	}
	if r.inflight == 0 {
		p.completeAbort(m.KVRequestID, m.RoundSeq, r)
		return
	}
	p.cancelWrites(r)
}

// cancelWrites stops the round's writes in flight on a path that can: their
// rows not yet sent are dropped, and their completions (so the abort_ack)
// come once nothing more of them will be written, not after every byte
// crossed the link. Other paths finish them.
func (p *producer) cancelWrites(r *round) {
	// The ids are those of whoever started the writes (startWrite): Rows
	// numbers its writes itself, so the transport's Cancel must not see them.
	var c data.Canceler = p.env.Rows
	if p.env.Rows == nil {
		var ok bool
		if c, ok = p.env.Data.(data.Canceler); !ok {
			return
		}
	}
	for id, t := range p.transfers {
		if t.r == r {
			c.Cancel(p.peerID, id)
		}
	}
}

func (p *producer) completeAbort(kvID string, seq uint64, r *round) {
	p.finalize(kvID, seq, false)
	if r.acked() {
		p.send(&protocol.AbortAck{KVRequestID: kvID, RoundSeq: seq})
	}
	p.prune(kvID)
}

// finish tells the producer no more supply comes for kvID: rounds with
// demand end now (or when their writes finish); lookups end.
func (p *producer) finish(kvID string) {
	p.dropLookups(kvID)
	req := p.requests[kvID]
	if req == nil {
		return
	}
	for _, seq := range sortedRounds(req.rounds) {
		r := req.rounds[seq]
		r.closeSupply()
		if r.state == roundFetched && r.inflight == 0 {
			p.finalize(kvID, seq, true)
		}
	}
	p.prune(kvID)
}

func (p *producer) write(kvID string, seq uint64, r *round, local, remote []uint64, jobs map[int64]int) {
	id, sums, err := p.startWrite(local, remote)
	if err != nil {
		p.env.Logf("ERROR", "peer %s: data write for kv_request_id=%s round=%d failed to start: %v",
			p.peerID, kvID, seq, err)
		r.kill(p.env.Now(), false)
		if r.inflight == 0 {
			p.finalize(kvID, seq, true)
		}
		return
	}
	r.writeStarted()
	for j := range jobs {
		if sj := p.jobs[j]; sj != nil {
			sj.carried++
		}
	}
	p.transfers[id] = &transfer{kvID: kvID, round: seq, r: r, rows: len(local), dst: remote, sums: sums, jobs: jobs}
}

// startWrite starts a data-path write of local rows src into the peer's
// rows dst, summing the source rows when the session verifies pulls: on
// Rows' goroutine (the sums come with the completion), or here, returned,
// when the owner gave no Rows.
func (p *producer) startWrite(src, dst []uint64) (uint64, []uint64, error) {
	switch {
	case p.env.Rows != nil && p.verifies():
		id, err := p.env.Rows.WriteSummed(p.peerID, src, dst)
		return id, nil, err
	case p.env.Rows != nil:
		id, err := p.env.Rows.Write(p.peerID, src, dst)
		return id, nil, err
	}
	var sums []uint64
	if p.verifies() {
		for _, r := range src {
			if r >= p.env.Region.NumRows() {
				return 0, nil, fmt.Errorf("%w: source row %d", data.ErrRowOutOfRange, r)
			}
		}
		sums = rowsum.Rows(p.env.Region, src)
	}
	id, err := p.env.Data.Write(p.peerID, src, dst)
	return id, sums, err
}

// complete applies a data-path completion.
func (p *producer) complete(c data.Completion) {
	id, err := c.ID, c.Err
	t := p.transfers[id]
	if t == nil {
		return // session closed meanwhile: its jobs were already reported
	}
	delete(p.transfers, id)
	r := t.r
	for j, n := range t.jobs {
		if sj := p.jobs[j]; sj != nil {
			sj.carried--
			if err == nil {
				sj.written += n
			}
		}
	}
	if err != nil && !errors.Is(err, data.ErrCanceled) { // canceled: the round was aborted
		p.env.Logf("WARNING", "peer %s: writing %d rows for kv_request_id=%s round=%d failed: %v",
			p.peerID, t.rows, t.kvID, t.round, err)
	}
	sums := c.Sums
	if sums == nil {
		sums = t.sums
	}
	r.writeEnded(p.env.Now(), err == nil, t.rows, t.dst, sums)
	if err != nil {
		p.releaseUncarried(r, false)
	}
	if r.inflight > 0 {
		return
	}
	switch {
	case r.state == roundAborting:
		p.completeAbort(t.kvID, t.round, r)
	case r.ready():
		p.finalize(t.kvID, t.round, true)
	}
	p.prune(t.kvID)
}

// releaseUncarried reports the round's jobs that no transfer is reading.
func (p *producer) releaseUncarried(r *round, ok bool) {
	for j := range r.jobs {
		sj := p.jobs[j]
		if sj == nil || sj.carried > 0 {
			continue
		}
		p.reportJob(j, ok)
		r.dropJob(j)
	}
	r.dropSupply()
}

func (p *producer) reportJob(j int64, ok bool) {
	sj := p.jobs[j]
	if sj == nil {
		return
	}
	delete(p.jobs, j)
	p.report(Report{Kind: StoreDone, JobID: j, OK: ok, Bytes: int64(sj.written) * int64(p.env.Region.RowLen)})
}

// finalize ends a round: reports its jobs, and tells the consumer with
// transfer_done when a fetch is waiting and sendDone is set. A round with
// writes in flight is finalized when they complete.
func (p *producer) finalize(kvID string, seq uint64, sendDone bool) {
	req := p.requests[kvID]
	if req == nil {
		return
	}
	r := req.rounds[seq]
	if r == nil || r.inflight > 0 {
		return
	}
	ok := r.succeeded()
	for j := range r.jobs {
		p.reportJob(j, ok)
	}
	r.dropJobs()
	r.dropKeys()
	if sendDone && r.fetchSeen && r.state != roundAborting {
		done := &protocol.TransferDone{KVRequestID: kvID, Success: ok, RoundSeq: seq}
		if ok && r.fetchRows != nil {
			done.RowSums = r.rowSums()
		}
		p.send(done)
	}
	if r.entomb() {
		return // a tombstone stays: a repeated fetch is a protocol error
	}
	req.dropRound(seq)
}

func (p *producer) tick(now time.Time) {
	timeout := p.env.Cfg.StoreTimeout
	for j, sj := range p.jobs {
		if sj.carried > 0 || now.Sub(sj.at) < timeout {
			continue
		}
		p.env.Logf("WARNING", "peer %s: stored rows of kv_request_id=%s (job %d) were not fetched within %v; releasing them",
			p.peerID, sj.kvID, j, timeout)
		req := p.requests[sj.kvID]
		var r *round
		if req != nil {
			r = req.rounds[sj.round]
		}
		if r != nil {
			r.dropSupplyOf(j) // so a late fetch cannot read rows the host reuses
			r.dropJob(j)
			r.closeSupply()
		}
		p.reportJob(j, false)
		switch {
		case r != nil && r.state == roundFetched && r.inflight == 0:
			p.finalize(sj.kvID, sj.round, true)
		case r != nil && r.state == roundOpen && len(r.jobs) == 0:
			// Nothing left to serve: a tombstone, so a late fetch fails at
			// once and the round expires instead of staying open forever.
			r.kill(now, false)
		}
		p.prune(sj.kvID)
	}
	p.expireRounds(now)
	p.tickLookups(now)
}

// expireRounds ends demand no supply met in time (a fetch for a kv id no
// local request stores, or whose prefill never came) and forgets tombstones
// after ReapedIDRetention, so nothing a peer asks for is held forever.
func (p *producer) expireRounds(now time.Time) {
	cfg := p.env.Cfg
	for kvID, req := range p.requests {
		ended := false
		for seq, r := range req.rounds {
			switch {
			case r.inflight > 0:
			case r.state == roundDead && now.Sub(r.since) >= cfg.ReapedIDRetention:
				req.dropRound(seq)
				ended = true
			case r.state == roundFetched && now.Sub(r.since) >= cfg.UnboundStoreTimeout:
				p.env.Logf("WARNING", "peer %s: fetch kv_request_id=%s round=%d still missed %d rows after %v; failing it (raise unbound_store_timeout_s if prefills outlast it)",
					p.peerID, kvID, seq, r.remaining, cfg.UnboundStoreTimeout)
				r.closeSupply()
				p.finalize(kvID, seq, true)
				ended = true
			}
		}
		if ended {
			p.prune(kvID)
		}
	}
}

// overCap says why the peer may not make us hold one more entry (a round,
// a tombstone or an inbound lookup) under kvID with keys more keys ("" when
// it may). Entries of every kv id count against max_requests_per_peer, and
// an entry holds at least one key's worth, so neither empty lookups nor
// tombstones of made-up rounds grow without bound. It reads running totals
// (holdings.go): every frame costs the same however much the peer holds.
func (p *producer) overCap(kvID string, keys int) string {
	cfg := p.env.Cfg
	if _, known := p.requests[kvID]; !known && len(p.requests) >= cfg.MaxRequestsPerPeer {
		return fmt.Sprintf("the peer already holds %d kv ids here (max_requests_per_peer)", len(p.requests))
	}
	if p.held.entries >= cfg.MaxRequestsPerPeer {
		return fmt.Sprintf("the peer already holds %d rounds and lookups here (max_requests_per_peer)", p.held.entries)
	}
	keys = max(1, keys)
	if p.held.keys+keys > cfg.MaxKeysPerPeer {
		return fmt.Sprintf("the peer's %d keys would exceed the %d it may hold here (max_keys_per_peer)", p.held.keys+keys, cfg.MaxKeysPerPeer)
	}
	if all := p.env.Keys; all != nil && all.Keys+keys > cfg.MaxKeysPerPeer {
		holders := all.Holders
		if p.held.keys == 0 {
			holders++
		}
		share := cfg.MaxKeysPerPeer / holders
		if p.held.keys+keys > share {
			return fmt.Sprintf("all peers' keys here would be %d, over the %d all may hold (max_keys_per_peer), "+
				"and this peer's %d over its share of them, %d", all.Keys+keys, cfg.MaxKeysPerPeer, p.held.keys+keys, share)
		}
	}
	return ""
}

// close reports every job as failed and every lookup as finished, and
// forgets every round.
func (p *producer) close() {
	for kvID, req := range p.requests {
		p.dropLookups(kvID)
		for seq := range req.rounds {
			req.dropRound(seq)
		}
	}
	for j := range p.jobs {
		p.reportJob(j, false)
	}
	clear(p.transfers)
	clear(p.requests)
}

// The owner's calls on the producer role.

// AddStoredBlocks adds rows the host stored (PD, round 0) or pinned for a
// lookup (its round) as supply, writing at once what is already demanded.
func (s *Session) AddStoredBlocks(kvID string, keys [][]byte, rows []uint64, jobID int64, roundSeq uint64, fromLookup bool) {
	s.producer.addStored(kvID, keys, rows, jobID, roundSeq, fromLookup)
}

// FinishProducer tells the producer no more supply comes for kvID: rounds
// with demand end now (or when their writes finish); lookups end.
func (s *Session) FinishProducer(kvID string) { s.producer.finish(kvID) }

// Complete applies a data-path completion.
func (s *Session) Complete(c data.Completion) { s.producer.complete(c) }

// TransfersInFlight reports whether data-path writes to the peer are running.
func (s *Session) TransfersInFlight() bool { return len(s.producer.transfers) > 0 }

// Holds reports the kv ids and keys the peer makes this producer hold.
func (s *Session) Holds() (kvIDs, keysWanted int) {
	return len(s.producer.requests), s.producer.held.wanted
}

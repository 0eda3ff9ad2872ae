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
	sums  []uint32      // its source rows' sums, when taken at the start
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
	s         *Session
	requests  map[string]*producerRequest
	held      holdings // over requests, kept by holdings.go
	transfers map[uint64]*transfer
	jobs      map[int64]*storeJob
}

func (p *producer) init(s *Session) {
	p.s = s
	p.requests = map[string]*producerRequest{}
	p.transfers = map[uint64]*transfer{}
	p.jobs = map[int64]*storeJob{}
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

// TransfersInFlight reports whether data-path writes to the peer are running.
func (s *Session) TransfersInFlight() bool { return len(s.producer.transfers) > 0 }

func (p *producer) request(id string) *producerRequest {
	r := p.requests[id]
	if r == nil {
		p.held.all = p.s.env.Keys
		r = newProducerRequest(&p.held)
		p.requests[id] = r
		p.s.busy()
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

// AddStoredBlocks adds rows the host stored (PD, round 0) or pinned for a
// lookup (its round) as supply, writing at once what is already demanded.
func (s *Session) AddStoredBlocks(kvID string, keys [][]byte, rows []uint64, jobID int64, roundSeq uint64, fromLookup bool) {
	p := &s.producer
	r := p.round(kvID, roundSeq)
	if !r.live() || s.dead {
		s.report(Report{Kind: StoreDone, JobID: jobID})
		return
	}
	p.jobs[jobID] = &storeJob{at: s.env.Now(), kvID: kvID, round: roundSeq}
	r.jobs[jobID] = struct{}{}
	if fromLookup {
		r.fromLookup = true
	}
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
		p.s.env.Logf("WARNING", "peer %s: fetch kv_request_id=%s round=%d refused: %s",
			p.s.peerID, m.KVRequestID, m.RoundSeq, why)
		p.s.send(&protocol.TransferDone{KVRequestID: m.KVRequestID, Success: false, RoundSeq: m.RoundSeq})
		return nil
	}
	rd := p.round(m.KVRequestID, m.RoundSeq)
	rd.fetch(p.s.env.Now(), len(m.Keys))
	if p.s.Verifies() {
		rd.verify(m.BlockIndexes)
	}
	if bad := p.badFetch(m); bad != "" {
		p.s.env.Logf("ERROR", "peer %s: fetch kv_request_id=%s round=%d rejected: %s",
			p.s.peerID, m.KVRequestID, m.RoundSeq, bad)
		rd.supplyClosed = true
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
		p.s.env.Logf("WARNING", "peer %s: fetch kv_request_id=%s round=%d asks for %d keys it was not promised; failing the round",
			p.s.peerID, m.KVRequestID, m.RoundSeq, len(rd.wanted))
		rd.supplyClosed = true
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
		p.s.report(Report{Kind: FetchArrived, KVID: m.KVRequestID})
	}
	return nil
}

// badFetch checks what vLLM's validator does not: consumer rows inside the
// region the consumer advertised, and no key asked twice.
func (p *producer) badFetch(m *protocol.Fetch) string {
	limit := p.s.peerRows
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
			p.round(m.KVRequestID, m.RoundSeq).kill(p.s.env.Now(), false)
		}
		p.s.send(&protocol.AbortAck{KVRequestID: m.KVRequestID, RoundSeq: m.RoundSeq})
		return
	}
	switch r.state {
	case roundOpen, roundFetched:
		r.kill(p.s.env.Now(), true)
		p.releaseUncarried(r, false)
	case roundDead:
		r.state = roundAborting // already failed: the ack goes once its writes in flight finished
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
	c, ok := p.s.env.Data.(data.Canceler)
	if !ok {
		return
	}
	for id, t := range p.transfers {
		if t.r == r {
			c.Cancel(p.s.peerID, id)
		}
	}
}

func (p *producer) completeAbort(kvID string, seq uint64, r *round) {
	p.finalize(kvID, seq, false)
	if r.state == roundAborting {
		r.state = roundDead
		p.s.send(&protocol.AbortAck{KVRequestID: kvID, RoundSeq: seq})
	}
	p.prune(kvID)
}

// FinishProducer tells the producer no more supply comes for kvID: rounds
// with demand end now (or when their writes finish); lookups end.
func (s *Session) FinishProducer(kvID string) {
	p := &s.producer
	p.dropLookups(kvID)
	req := p.requests[kvID]
	if req == nil {
		return
	}
	for _, seq := range sortedRounds(req.rounds) {
		r := req.rounds[seq]
		r.supplyClosed = true
		if r.state == roundFetched && r.inflight == 0 {
			p.finalize(kvID, seq, true)
		}
	}
	p.prune(kvID)
}

func (p *producer) write(kvID string, seq uint64, r *round, local, remote []uint64, jobs map[int64]int) {
	id, sums, err := p.s.startWrite(local, remote)
	if err != nil {
		p.s.env.Logf("ERROR", "peer %s: data write for kv_request_id=%s round=%d failed to start: %v",
			p.s.peerID, kvID, seq, err)
		r.kill(p.s.env.Now(), false)
		if r.inflight == 0 {
			p.finalize(kvID, seq, true)
		}
		return
	}
	r.inflight++
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
func (s *Session) startWrite(src, dst []uint64) (uint64, []uint32, error) {
	switch {
	case s.env.Rows != nil && s.Verifies():
		id, err := s.env.Rows.WriteSummed(s.peerID, src, dst)
		return id, nil, err
	case s.env.Rows != nil:
		id, err := s.env.Rows.Write(s.peerID, src, dst)
		return id, nil, err
	}
	var sums []uint32
	if s.Verifies() {
		for _, r := range src {
			if r >= s.env.Region.NumRows() {
				return 0, nil, fmt.Errorf("%w: source row %d", data.ErrRowOutOfRange, r)
			}
		}
		sums = rowsum.Rows(s.env.Region, src)
	}
	id, err := s.env.Data.Write(s.peerID, src, dst)
	return id, sums, err
}

// TransferComplete applies a data-path completion without row sums.
func (s *Session) TransferComplete(id uint64, err error) {
	s.Complete(data.Completion{ID: id, Err: err})
}

// Complete applies a data-path completion.
func (s *Session) Complete(c data.Completion) {
	id, err := c.ID, c.Err
	p := &s.producer
	t := p.transfers[id]
	if t == nil {
		return // session closed meanwhile: its jobs were already reported
	}
	delete(p.transfers, id)
	r := t.r
	r.inflight--
	for j, n := range t.jobs {
		if sj := p.jobs[j]; sj != nil {
			sj.carried--
			if err == nil {
				sj.written += n
			}
		}
	}
	if err != nil && !errors.Is(err, data.ErrCanceled) { // canceled: the round was aborted
		s.env.Logf("WARNING", "peer %s: writing %d rows for kv_request_id=%s round=%d failed: %v",
			s.peerID, t.rows, t.kvID, t.round, err)
	}
	if err != nil {
		r.kill(s.env.Now(), false)
		p.releaseUncarried(r, false)
	} else if r.live() {
		r.remaining -= t.rows
		sums := c.Sums
		if sums == nil {
			sums = t.sums
		}
		r.landed(t.dst, sums)
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
		delete(r.jobs, j)
	}
	r.dropSupply()
}

func (p *producer) reportJob(j int64, ok bool) {
	sj := p.jobs[j]
	if sj == nil {
		return
	}
	delete(p.jobs, j)
	p.s.report(Report{Kind: StoreDone, JobID: j, OK: ok, Bytes: int64(sj.written) * int64(p.s.env.Region.RowLen)})
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
	clear(r.jobs)
	r.dropKeys()
	if sendDone && r.fetchSeen && r.state != roundAborting {
		done := &protocol.TransferDone{KVRequestID: kvID, Success: ok, RoundSeq: seq}
		if ok && r.fetchRows != nil {
			done.RowSums = r.rowSums()
		}
		p.s.send(done)
	}
	if !r.live() {
		r.fetchSeen = true // keep the tombstone; a repeated fetch is a protocol error
		return
	}
	req.dropRound(seq)
}

func (p *producer) tick(now time.Time) {
	timeout := p.s.env.Cfg.StoreTimeout
	for j, sj := range p.jobs {
		if sj.carried > 0 || now.Sub(sj.at) < timeout {
			continue
		}
		p.s.env.Logf("WARNING", "peer %s: stored rows of kv_request_id=%s (job %d) were not fetched within %v; releasing them",
			p.s.peerID, sj.kvID, j, timeout)
		req := p.requests[sj.kvID]
		var r *round
		if req != nil {
			r = req.rounds[sj.round]
		}
		if r != nil {
			r.dropSupplyOf(j) // so a late fetch cannot read rows the host reuses
			delete(r.jobs, j)
			r.supplyClosed = true
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
	cfg := p.s.env.Cfg
	for kvID, req := range p.requests {
		ended := false
		for seq, r := range req.rounds {
			switch {
			case r.inflight > 0:
			case r.state == roundDead && now.Sub(r.since) >= cfg.ReapedIDRetention:
				req.dropRound(seq)
				ended = true
			case r.state == roundFetched && now.Sub(r.since) >= cfg.UnboundStoreTimeout:
				p.s.env.Logf("WARNING", "peer %s: fetch kv_request_id=%s round=%d still missed %d rows after %v; failing it (raise unbound_store_timeout_s if prefills outlast it)",
					p.s.peerID, kvID, seq, r.remaining, cfg.UnboundStoreTimeout)
				r.supplyClosed = true
				p.finalize(kvID, seq, true)
				ended = true
			}
		}
		if ended && len(req.rounds) == 0 && len(req.lookups) == 0 {
			delete(p.requests, kvID)
		} else if ended {
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
	cfg := p.s.env.Cfg
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
	if all := p.s.env.Keys; all != nil && all.Keys+keys > cfg.MaxKeysPerPeer {
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

// Holds reports the kv ids and keys the peer makes this producer hold.
func (s *Session) Holds() (kvIDs, keysWanted int) {
	return len(s.producer.requests), s.producer.held.wanted
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

package session

import (
	"fmt"
	"sort"
	"time"

	"github.com/peerkv/peerkv/core/protocol"
)

// Probe answers for one key.
type probe int8

const (
	probeUnsent probe = iota // registered this step, not yet asked
	probeAsked               // asked, no answer yet
	probeHit                 // the peer holds it
	probeMiss                // the peer does not, or the answer timed out
)

// load is one fetch round in flight.
type load struct {
	jobID     int64
	rows      []uint64
	sentAt    time.Time
	abortedAt time.Time // zero until aborted
	// fetch is the load's fetch; while it waits in the session's queue
	// (the handshake not finished) the peer knows nothing of the load.
	fetch *protocol.Fetch
}

// askedBatch is one lookup sent and not wholly answered. Its deadline runs
// from when its first key was asked (registered), whatever the session's
// state then and whatever the peer answers meanwhile: neither a handshake
// that never finishes nor a producer that keeps sending empty or partial
// answers can hold keys at RETRY.
type askedBatch struct {
	at     time.Time // its first key asked: the deadline runs from here
	sentAt time.Time // the lookup sent: its round trip runs from here
	keys   [][]byte
	timed  bool // its round trip was observed (Env.LookupAnswered)
}

// consumerRequest is the state of one kv_request_id we pull from this peer.
type consumerRequest struct {
	probes probeTable
	// unsent are the keys added to probes since the last lookup went out:
	// always its newest entries (probeUnsent unless answered early).
	unsent     [][]byte
	unsentAt   time.Time    // when the first of unsent was asked
	round      uint64       // next fetch round
	lookupOpen bool         // the peer holds lookup state no fetch has closed
	asked      []askedBatch // oldest first
	loads      map[uint64]*load
}

func (r *consumerRequest) idle() bool {
	return len(r.loads) == 0 && r.probes.len() == 0 && len(r.unsent) == 0
}

// dropAnswered forgets the oldest batches once none of their keys awaits
// an answer.
func (r *consumerRequest) dropAnswered() {
	for len(r.asked) > 0 {
		for _, k := range r.asked[0].keys {
			if p, _ := r.probes.get(k); p == probeAsked {
				return
			}
		}
		r.asked = r.asked[1:]
	}
	r.asked = nil
}

// consumer is the role that pulls rows from the peer.
type consumer struct {
	link
	requests map[string]*consumerRequest
	flush    map[string]struct{} // requests with unsent probes
}

func newConsumer(l link) consumer {
	return consumer{link: l, requests: make(map[string]*consumerRequest), flush: make(map[string]struct{})}
}

func (c *consumer) busy() bool {
	for _, r := range c.requests {
		if len(r.loads) > 0 || len(r.asked) > 0 || len(r.unsent) > 0 {
			return true
		}
	}
	return false
}

func (c *consumer) request(id string) *consumerRequest {
	r := c.requests[id]
	if r == nil {
		r = &consumerRequest{loads: make(map[uint64]*load)}
		c.requests[id] = r
		c.engaged()
	}
	return r
}

func (c *consumer) prune(id string) {
	if r := c.requests[id]; r != nil && r.idle() && !r.lookupOpen {
		delete(c.requests, id)
	}
}

// registerLookup: see Session.RegisterLookup.
func (c *consumer) registerLookup(kvRequestID string, key []byte) (hit, known bool) {
	r := c.request(kvRequestID)
	switch p, seen := r.probes.get(key); {
	case p == probeHit:
		return true, true
	case p == probeMiss:
		return false, true
	case !seen:
		r.probes.add(key)
		if len(r.unsent) == 0 {
			c.flush[kvRequestID] = struct{}{} // a request is in flush while it has unsent keys
			r.unsentAt = c.env.Now()
		}
		r.unsent = append(r.unsent, key)
	}
	return false, false
}

// reserveLookups: see Session.ReserveLookups.
func (c *consumer) reserveLookups(kvRequestID string, n int) {
	r := c.request(kvRequestID)
	r.probes.reserve(n)
	if len(r.unsent) == 0 && cap(r.unsent) < n {
		r.unsent = make([][]byte, 0, n)
	}
}

// probed: see Session.Probed.
func (c *consumer) probed(kvRequestID string, key []byte) (hit, known bool) {
	r := c.requests[kvRequestID]
	if r == nil {
		return false, false
	}
	switch p, _ := r.probes.get(key); p {
	case probeHit:
		return true, true
	case probeMiss:
		return false, true
	}
	return false, false
}

// flushAll: see Session.FlushLookups.
func (c *consumer) flushAll() {
	if len(c.flush) == 0 {
		return
	}
	for id := range c.flush {
		c.flushOne(id)
	}
}

// flushRequest: see Session.FlushLookup.
func (c *consumer) flushRequest(kvRequestID string) {
	if _, ok := c.flush[kvRequestID]; ok {
		c.flushOne(kvRequestID)
	}
}

func (c *consumer) flushOne(id string) {
	delete(c.flush, id)
	r := c.requests[id]
	if r == nil || len(r.unsent) == 0 {
		return
	}
	r.probes.markNewest(len(r.unsent), probeUnsent, probeAsked)
	r.lookupOpen = true
	r.asked = append(r.asked, askedBatch{at: r.unsentAt, sentAt: c.env.Now(), keys: r.unsent})
	c.send(&protocol.Lookup{KVRequestID: id, Keys: r.unsent, RoundSeq: r.round})
	r.unsent = nil
}

// requestBlocks: see Session.RequestBlocks.
func (c *consumer) requestBlocks(jobID int64, kvRequestID string, keys [][]byte, rows []uint64) uint64 {
	r := c.request(kvRequestID)
	round := r.round
	r.round++
	fetch := &protocol.Fetch{KVRequestID: kvRequestID, Keys: keys, BlockIndexes: rows, RoundSeq: round}
	r.loads[round] = &load{jobID: jobID, rows: rows, sentAt: c.env.Now(), fetch: fetch}
	r.lookupOpen = false
	r.asked = nil
	r.probes.clear()
	r.unsent = nil
	delete(c.flush, kvRequestID)
	c.send(fetch)
	return round
}

// abortLoad: see Session.AbortLoad.
func (c *consumer) abortLoad(kvRequestID string, round uint64) {
	r := c.requests[kvRequestID]
	if r == nil {
		return
	}
	if l := r.loads[round]; l != nil && l.abortedAt.IsZero() {
		c.abort(kvRequestID, r, round, l, c.env.Now())
	}
}

// abort ends load l: with an abort_fetch when its fetch went out (LoadDone
// follows the peer's ack, or the ack's deadline), else at once: the fetch
// is taken back from the queue, so the peer never learns of the load and
// no ack of it can ever come.
func (c *consumer) abort(id string, r *consumerRequest, round uint64, l *load, now time.Time) {
	if c.unsend(l.fetch) {
		delete(r.loads, round)
		c.report(Report{Kind: LoadDone, JobID: l.jobID, KVID: id, Round: round, Rows: l.rows})
		return
	}
	l.abortedAt = now
	c.send(&protocol.AbortFetch{KVRequestID: id, RoundSeq: round})
}

// finish: see Session.FinishConsumer.
func (c *consumer) finish(kvRequestID string) {
	r := c.requests[kvRequestID]
	if r == nil {
		return
	}
	now := c.env.Now()
	for _, round := range sortedRounds(r.loads) {
		if l := r.loads[round]; l.abortedAt.IsZero() {
			c.abort(kvRequestID, r, round, l, now)
		}
	}
	c.closeLookup(kvRequestID, r)
}

// holdsAnswers: see Session.HoldsAnswers.
func (c *consumer) holdsAnswers(kvRequestID string) bool {
	r := c.requests[kvRequestID]
	return r != nil && r.lookupOpen && len(r.loads) == 0
}

// endLookup: see Session.EndLookup.
func (c *consumer) endLookup(kvRequestID string) bool {
	if !c.holdsAnswers(kvRequestID) {
		return false
	}
	c.closeLookup(kvRequestID, c.requests[kvRequestID])
	return true
}

// closeLookup sends the terminal fetch if the peer holds lookup state for
// the request, and forgets its probes.
func (c *consumer) closeLookup(kvRequestID string, r *consumerRequest) {
	if r.lookupOpen {
		r.lookupOpen = false
		c.send(&protocol.Fetch{KVRequestID: kvRequestID, Keys: [][]byte{}, BlockIndexes: []uint64{}, RoundSeq: r.round})
	}
	r.probes.clear()
	r.unsent = nil
	r.asked = nil
	delete(c.flush, kvRequestID)
	c.prune(kvRequestID)
}

func (c *consumer) onLookupResp(m *protocol.LookupResp) {
	r := c.requests[m.KVRequestID]
	if r == nil {
		return // finished meanwhile; the producer may split or coalesce answers
	}
	if len(r.asked) > 0 && !r.asked[0].timed && c.answered != nil {
		r.asked[0].timed = true // the first answer since the oldest open lookup went out
		c.answered(c.env.Now().Sub(r.asked[0].sentAt))
	}
	changed := false
	for i, k := range m.Keys {
		if p, ok := r.probes.get(k); ok && p < probeHit {
			changed = true
			if m.Hits[i] {
				r.probes.set(k, probeHit)
			} else {
				r.probes.set(k, probeMiss)
			}
		}
	}
	r.dropAnswered()
	if changed { // an empty or repeated answer changes nothing to re-evaluate
		c.report(Report{Kind: ProbesAnswered, KVID: m.KVRequestID})
	}
}

func (c *consumer) onTransferDone(m *protocol.TransferDone) {
	c.finishLoad(m.KVRequestID, m.RoundSeq, m.Success, "transfer_done", m.RowSums)
}

func (c *consumer) onAbortAck(m *protocol.AbortAck) {
	c.finishLoad(m.KVRequestID, m.RoundSeq, false, "abort_ack", nil)
}

// IntegrityMissing is the integrity failure of a successful transfer_done
// that lacks a checksum for each row of its load although both sides
// offered verified pulls.
const IntegrityMissing = "missing"

func (c *consumer) finishLoad(id string, round uint64, ok bool, via string, sums []uint64) {
	r := c.requests[id]
	var l *load
	if r != nil {
		l = r.loads[round]
	}
	if l == nil {
		c.env.Logf("WARNING", "peer %s: %s for unknown kv_request_id=%s round=%d (duplicate, or raced with a local timeout)",
			c.peerID, via, id, round)
		return
	}
	delete(r.loads, round)
	if !ok && via == "transfer_done" {
		c.env.Logf("WARNING", "peer %s could not supply kv_request_id=%s round=%d; the request recomputes locally",
			c.peerID, id, round)
	}
	integrity := ""
	if !c.verifies() || !ok {
		sums = nil
	} else if len(sums) != len(l.rows) {
		// The owner logs it (rate-limited) and counts it.
		ok, sums, integrity = false, nil, IntegrityMissing
	}
	// A failed load fails its own request only. A failed transfer may have
	// been cut mid-part with rows still in flight to us: fence those too.
	c.report(Report{Kind: LoadDone, JobID: l.jobID, OK: ok, KVID: id, Round: round, Rows: l.rows,
		Fence: !ok && via == "transfer_done", Sums: sums, Integrity: integrity})
	c.prune(id)
}

func (c *consumer) tick(now time.Time) {
	cfg := c.env.Cfg
	for id, r := range c.requests {
		for _, round := range sortedRounds(r.loads) {
			l := r.loads[round]
			switch {
			case l.abortedAt.IsZero() && now.Sub(l.sentAt) >= cfg.LoadTimeout:
				c.env.Logf("WARNING", "peer %s: load kv_request_id=%s round=%d got no transfer_done within %v; aborting",
					c.peerID, id, round, cfg.LoadTimeout)
				c.abort(id, r, round, l, now)
			case !l.abortedAt.IsZero() && now.Sub(l.abortedAt) >= cfg.AbortAckTimeout:
				c.env.Logf("WARNING", "peer %s: no abort_ack for kv_request_id=%s round=%d within %v; failing the load "+
					"and ending the session, so none of the peer's writes still under way can land later",
					c.peerID, id, round, cfg.AbortAckTimeout)
				delete(r.loads, round)
				c.report(Report{Kind: LoadDone, JobID: l.jobID, KVID: id, Round: round, Rows: l.rows, Fence: true})
				// Its grants (the TCP data token) die with the session: a write
				// the peer still has queued cannot open a new connection.
				c.fail(fmt.Sprintf("no abort_ack for kv_request_id=%s round=%d within %v", id, round, cfg.AbortAckTimeout))
			}
		}
		unsent, n := c.expireUnsent(id, r, now), 0
		for len(r.asked) > 0 && now.Sub(r.asked[0].at) >= cfg.LookupTimeout {
			for _, k := range r.asked[0].keys {
				if r.probes.move(k, probeAsked, probeMiss) {
					n++
				}
			}
			r.asked = r.asked[1:]
		}
		if n > 0 {
			c.env.Logf("WARNING", "peer %s did not answer lookup for kv_request_id=%s within %v; treating %d keys as misses",
				c.peerID, id, cfg.LookupTimeout, n)
		}
		if unsent+n > 0 {
			c.report(Report{Kind: ProbesAnswered, KVID: id})
		}
		c.prune(id)
	}
}

// expireUnsent makes misses of keys asked lookup_timeout_s ago that could
// not be sent since (the handshake has not finished), and counts them.
func (c *consumer) expireUnsent(id string, r *consumerRequest, now time.Time) int {
	if len(r.unsent) == 0 || now.Sub(r.unsentAt) < c.env.Cfg.LookupTimeout {
		return 0
	}
	n := 0
	for _, k := range r.unsent {
		if r.probes.move(k, probeUnsent, probeMiss) {
			n++
		}
	}
	r.unsent = nil
	delete(c.flush, id)
	c.env.Logf("WARNING", "peer %s: lookup for kv_request_id=%s could not be sent within %v (the session's "+
		"handshake has not finished); treating %d keys as misses", c.peerID, id, c.env.Cfg.LookupTimeout, n)
	return n
}

// close fails every load (and so its request) and marks every request with
// unanswered probes as failed, so its lookups answer MISS.
func (c *consumer) close() {
	for id, r := range c.requests {
		for _, round := range sortedRounds(r.loads) {
			l := r.loads[round]
			c.report(Report{Kind: LoadDone, JobID: l.jobID, KVID: id, Round: round, Rows: l.rows, Fence: true})
		}
		if r.probes.any(probeAsked, probeUnsent) {
			c.report(Report{Kind: ConsumerFailed, KVID: id})
		}
	}
	clear(c.requests)
	clear(c.flush)
}

func sortedRounds[V any](m map[uint64]V) []uint64 {
	out := make([]uint64, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// The owner's calls on the consumer role.

// RegisterLookup answers one probe of a P2P consumer: HIT/MISS once the peer
// answered, RETRY (registering the key for this step's lookup) until then.
// The session keeps key (no copy, not even for its map key: one per key a
// step adds up): the caller must never change it.
func (s *Session) RegisterLookup(kvRequestID string, key []byte) (hit, known bool) {
	return s.consumer.registerLookup(kvRequestID, key)
}

// ReserveLookups makes room for n keys about to be registered under
// kvRequestID, if none is yet.
func (s *Session) ReserveLookups(kvRequestID string, n int) {
	s.consumer.reserveLookups(kvRequestID, n)
}

// Probed is what the peer answered for key in kvRequestID's current round,
// without registering it: hit once it said so, known once it answered.
func (s *Session) Probed(kvRequestID string, key []byte) (hit, known bool) {
	return s.consumer.probed(kvRequestID, key)
}

// FlushLookups sends one lookup per request with keys registered since the
// last flush. Probes wait for the handshake; its deadline bounds them.
func (s *Session) FlushLookups() {
	if s.Ready() {
		s.consumer.flushAll()
	}
}

// FlushLookup sends kvRequestID's registered keys now, not at the host's
// step end (a load retrying keys here must not wait for one).
func (s *Session) FlushLookup(kvRequestID string) {
	if s.Ready() {
		s.consumer.flushRequest(kvRequestID)
	}
}

// RequestBlocks sends the fetch that closes the request's current round,
// and returns that round (its LoadDone report carries it).
func (s *Session) RequestBlocks(jobID int64, kvRequestID string, keys [][]byte, rows []uint64) uint64 {
	return s.consumer.requestBlocks(jobID, kvRequestID, keys, rows)
}

// AbortLoad aborts one load in flight (once): its LoadDone follows, on the
// peer's abort_ack or transfer_done, or at the abort-ack deadline.
func (s *Session) AbortLoad(kvRequestID string, round uint64) {
	s.consumer.abortLoad(kvRequestID, round)
}

// FinishConsumer ends a request locally: aborts its loads (still reported
// when the abort is acknowledged or times out) and sends the terminal fetch
// if the peer holds lookup state for it.
func (s *Session) FinishConsumer(kvRequestID string) {
	s.consumer.finish(kvRequestID)
}

// HoldsAnswers reports whether the peer holds answers of the request that
// no fetch closed (rows it may have pinned for them), with no fetch of the
// request in flight.
func (s *Session) HoldsAnswers(kvRequestID string) bool {
	return s.consumer.holdsAnswers(kvRequestID)
}

// EndLookup ends a request's lookups here while the request goes on, where
// HoldsAnswers: the terminal fetch releases every row the peer pinned for
// its answers, and nothing more is asked under kvRequestID. It says whether
// it did.
func (s *Session) EndLookup(kvRequestID string) bool {
	return s.consumer.endLookup(kvRequestID)
}

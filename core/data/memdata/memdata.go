// Package memdata is an in-memory data.Transport for tests: transports
// created from one Hub write into each other's regions with copy().
//
// It keeps the semantics of the real transports: Write returns at once and
// the outcome arrives on Completions exactly once; the destination's
// WriteGuard and row range are checked for every row before anything is
// written; RemovePeer and Close fail pending transfers. Hooks on the Hub
// inject failures (SetFail) and slow completions (SetDelay, SetDelayFrom).
//
// Errors: Write itself fails for an unknown peer, a closed transport,
// src/dst of different lengths and a src row outside this region. A dst row
// outside the peer's region or refused by its guard is reported on
// Completions (ErrRowOutOfRange / ErrRejected), as the receiver decides.
//
// Completions is closed when Close returns.
package memdata

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/peerkv/peerkv/core/data"
)

// ErrInjected is reported for writes to a peer marked with Hub.SetFail.
var ErrInjected = errors.New("memdata: injected write failure")

// completionBuffer bounds how many unread completions queue before the
// writer goroutines wait for the reader.
const completionBuffer = 1024

// Hub connects the transports of one test.
type Hub struct {
	mu      sync.Mutex
	members map[string]*Transport
	failing map[string]bool
	delay   time.Duration
	from    map[string]time.Duration // per sender, instead of delay
}

// NewHub returns an empty hub.
func NewHub() *Hub {
	return &Hub{members: map[string]*Transport{}, failing: map[string]bool{}, from: map[string]time.Duration{}}
}

// Transport creates the transport of peer peerID over region; guard (nil =
// allow all) decides which rows other peers may write into it. A transport
// already registered under peerID is replaced in the hub.
func (h *Hub) Transport(peerID string, region data.Region, guard data.WriteGuard) *Transport {
	t := &Transport{
		hub:     h,
		localID: peerID,
		region:  region,
		guard:   guard,
		peers:   map[string]data.PeerInfo{},
		pending: map[uint64]*transfer{},
		outbox:  data.NewOutbox(completionBuffer),
	}
	h.mu.Lock()
	h.members[peerID] = t
	h.mu.Unlock()
	return t
}

// WritesUnguarded implements data.Unguarded: with a guard, every row a
// peer writes is copied in by the guard.
func (t *Transport) WritesUnguarded() bool { return t.guard == nil }

// SetFail makes every transfer to peerID fail with ErrInjected while fail is
// true (transfers already copying are not affected).
func (h *Hub) SetFail(peerID string, fail bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.failing[peerID] = fail
}

// SetDelay delays every later transfer by d before it copies and completes.
func (h *Hub) SetDelay(d time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.delay = d
}

// SetDelayFrom delays every later transfer peerID sends by d instead (one
// slow source among fast ones).
func (h *Hub) SetDelayFrom(peerID string, d time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.from[peerID] = d
}

func (h *Hub) currentDelay(sender string) time.Duration {
	h.mu.Lock()
	defer h.mu.Unlock()
	if d, ok := h.from[sender]; ok {
		return d
	}
	return h.delay
}

// destination returns the live transport of peerID, or why it cannot be
// written.
func (h *Hub) destination(peerID string) (*Transport, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.failing[peerID] {
		return nil, ErrInjected
	}
	dst, ok := h.members[peerID]
	if !ok {
		return nil, fmt.Errorf("%w: %s is not in the hub", data.ErrUnknownPeer, peerID)
	}
	return dst, nil
}

func (h *Hub) leave(t *Transport) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.members[t.localID] == t {
		delete(h.members, t.localID)
	}
}

// Transport is one peer's in-memory data path.
type Transport struct {
	hub     *Hub
	localID string
	region  data.Region
	guard   data.WriteGuard
	copyMu  sync.Mutex        // held while a peer copies into region
	fences  map[string]uint64 // sender -> fence epoch (under copyMu): writes begun before a Fence are refused

	mu      sync.Mutex
	peers   map[string]data.PeerInfo
	pending map[uint64]*transfer
	nextID  uint64
	closed  bool

	outbox  *data.Outbox
	workers sync.WaitGroup
}

// transfer is one pending Write; cancel is closed when it was failed from
// outside (RemovePeer, Close) so its goroutine stops waiting.
type transfer struct {
	peerID string
	cancel chan struct{}
	epoch  uint64 // the destination's fence epoch for us when the write began
}

var _ data.Transport = (*Transport)(nil)

// Name implements data.Transport.
func (t *Transport) Name() string { return "mem" }

// AgentMetadata implements data.Transport.
func (t *Transport) AgentMetadata() []byte { return []byte("memdata:" + t.localID) }

// DataAddr implements data.Transport; memdata has no listener.
func (t *Transport) DataAddr() string { return "" }

// AddPeer registers peerID, which must already have a transport in the hub
// with the same row length.
func (t *Transport) AddPeer(peerID string, info data.PeerInfo) error {
	if info.RowLen != t.region.RowLen {
		return fmt.Errorf("memdata: peer %s row length %d differs from ours %d", peerID, info.RowLen, t.region.RowLen)
	}
	t.hub.mu.Lock()
	_, inHub := t.hub.members[peerID]
	t.hub.mu.Unlock()
	if !inHub {
		return fmt.Errorf("%w: %s is not in the hub", data.ErrUnknownPeer, peerID)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return data.ErrClosed
	}
	t.peers[peerID] = info
	return nil
}

// RemovePeer forgets peerID and fails its pending transfers.
func (t *Transport) RemovePeer(peerID string) {
	t.mu.Lock()
	delete(t.peers, peerID)
	var ids []uint64
	for id, tr := range t.pending {
		if tr.peerID == peerID {
			ids = append(ids, id)
		}
	}
	t.mu.Unlock()
	for _, id := range ids {
		t.finish(id, fmt.Errorf("%w: %s removed while the transfer was pending", data.ErrUnknownPeer, peerID))
	}
}

// Write starts copying local rows src[i] to the peer's rows dst[i].
func (t *Transport) Write(peerID string, src, dst []uint64) (uint64, error) {
	if len(src) != len(dst) {
		return 0, fmt.Errorf("memdata: %d source rows but %d destination rows", len(src), len(dst))
	}
	for _, row := range src {
		if row >= t.region.NumRows() {
			return 0, fmt.Errorf("%w: source row %d, region has %d", data.ErrRowOutOfRange, row, t.region.NumRows())
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return 0, data.ErrClosed
	}
	if _, ok := t.peers[peerID]; !ok {
		return 0, fmt.Errorf("%w: %s", data.ErrUnknownPeer, peerID)
	}
	t.nextID++
	id := t.nextID
	tr := &transfer{peerID: peerID, cancel: make(chan struct{})}
	if to, err := t.hub.destination(peerID); err == nil {
		tr.epoch = to.fenceEpoch(t.localID)
	}
	t.pending[id] = tr
	t.workers.Add(1)
	go t.run(id, tr, append([]uint64(nil), src...), append([]uint64(nil), dst...))
	return id, nil
}

// run performs one transfer after the hub's delay.
func (t *Transport) run(id uint64, tr *transfer, src, dst []uint64) {
	defer t.workers.Done()
	defer func() {
		if p := recover(); p != nil {
			t.finish(id, fmt.Errorf("memdata: panic in transfer %d: %v", id, p))
		}
	}()
	if d := t.hub.currentDelay(t.localID); d > 0 {
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-tr.cancel:
			return
		}
	}
	t.finish(id, t.copyRows(tr.peerID, src, dst, tr.epoch))
}

func (t *Transport) fenceEpoch(from string) uint64 {
	t.copyMu.Lock()
	defer t.copyMu.Unlock()
	return t.fences[from]
}

// Fence implements data.Fencer: writes from peerID that began before it
// are refused (a copy in progress finishes first: Fence waits for copyMu).
func (t *Transport) Fence(peerID string) {
	t.copyMu.Lock()
	defer t.copyMu.Unlock()
	if t.fences == nil {
		t.fences = map[string]uint64{}
	}
	t.fences[peerID]++
}

// copyRows checks every destination row, then copies; a refused row means
// nothing is written.
func (t *Transport) copyRows(peerID string, src, dst []uint64, epoch uint64) error {
	to, err := t.hub.destination(peerID)
	if err != nil {
		return err
	}
	if to.region.RowLen != t.region.RowLen {
		return fmt.Errorf("memdata: peer %s row length %d differs from ours %d", peerID, to.region.RowLen, t.region.RowLen)
	}
	for _, row := range dst {
		if row >= to.region.NumRows() {
			return fmt.Errorf("%w: destination row %d, %s has %d", data.ErrRowOutOfRange, row, peerID, to.region.NumRows())
		}
		if to.guard != nil && !to.guard.MayWrite(t.localID, row) {
			return fmt.Errorf("%w: %s refused row %d", data.ErrRejected, peerID, row)
		}
	}
	// Serialise writers into one region so concurrent transfers to the
	// same rows do not trip the race detector in tests.
	to.copyMu.Lock()
	defer to.copyMu.Unlock()
	if to.fences[t.localID] != epoch {
		return fmt.Errorf("%w: %s fenced our writes begun before", data.ErrRejected, peerID)
	}
	for i := range src {
		if to.guard == nil {
			copy(to.region.Row(dst[i]), t.region.Row(src[i]))
		} else if !to.guard.WriteRow(t.localID, dst[i], to.region.Row(dst[i]), t.region.Row(src[i])) {
			return fmt.Errorf("%w: %s refused row %d", data.ErrRejected, peerID, dst[i])
		}
	}
	return nil
}

// finish reports transfer id once; later calls for the same id do nothing.
func (t *Transport) finish(id uint64, err error) {
	t.mu.Lock()
	tr, ok := t.pending[id]
	if ok {
		delete(t.pending, id)
	}
	t.mu.Unlock()
	if !ok {
		return
	}
	close(tr.cancel)
	t.outbox.Send(data.Completion{PeerID: tr.peerID, ID: id, Err: err})
}

// Completions implements data.Transport. It is closed when Close returns.
func (t *Transport) Completions() <-chan data.Completion { return t.outbox.C() }

// Close fails pending transfers, waits for their goroutines and leaves the
// hub. It is idempotent.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	t.outbox.StartClosing()
	ids := make([]uint64, 0, len(t.pending))
	for id := range t.pending {
		ids = append(ids, id)
	}
	t.mu.Unlock()
	for _, id := range ids {
		t.finish(id, data.ErrClosed)
	}
	t.workers.Wait()
	t.hub.leave(t)
	t.outbox.Finish()
	return nil
}

package zmqctl

import (
	"bytes"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/peerkv/peerkv/core/control"
)

// Transport is a control.Transport over ZMQ; see the package comment.
type Transport struct {
	localID  string
	bindAddr string
	opts     Options
	log      *slog.Logger

	events  chan control.Event
	hand    func(control.Event) // guarded by mu: set by Hand, adopted by the pump
	adopted chan struct{}       // closed once the pump hands events over
	wake    *waker
	pump    *pump         // its peers and idle DEALERs are guarded by mu
	done    chan struct{} // closed when the pump has exited

	mu       sync.Mutex
	closing  atomic.Bool             // set under mu; read by the pump without it
	commands []command               // guarded by mu
	queued   map[string]queuedFrames // guarded by mu: per peer, what waits in front of libzmq
	// queuedBytes is the sum of queued's bytes (guarded by mu), bounded by
	// Options.TotalSendQueueBytes for peers over their share (admitLocked).
	queuedBytes int
	failure     atomic.Pointer[error] // why the pump died, if it did

	closeOnce sync.Once
	counters  counters
}

var (
	_ control.Transport = (*Transport)(nil)
	_ control.Handing   = (*Transport)(nil)
	_ control.Redialer  = (*Transport)(nil)
)

type commandKind int

const (
	cmdConnect commandKind = iota + 1
	cmdSend
	cmdDisconnect
	cmdRedial
)

// queuedFrames is what waits for one peer in front of libzmq: frames
// handed to Send and not yet taken by libzmq.
type queuedFrames struct{ frames, bytes int }

// frameOverhead is what one queued frame costs besides its payload (slice
// header, command), so that many empty frames count too.
const frameOverhead = 64

func frameCost(frame []byte) int { return len(frame) + frameOverhead }

type command struct {
	kind   commandKind
	peerID string
	ep     endpoint
	frame  []byte
}

// Stats is a snapshot of a transport's counters.
type Stats struct {
	FramesIn        uint64 // frames delivered as EventFrame
	FramesOut       uint64 // frames handed to a DEALER
	DroppedInbound  uint64 // ROUTER messages without exactly [identity, payload]
	DroppedOutbound uint64 // frames discarded: peer down, send queue full, disconnect
	PeersUp         uint64 // ZMTP handshakes completed on DEALERs
	PeersDown       uint64 // EventPeerDown reported
	OpenPeers       int64  // DEALERs open now
	// QueuedSendBytes is what waits in front of libzmq now, all peers
	// (payload plus a fixed cost per frame); bounded per peer by
	// Options.SendQueueBytes and in all by Options.TotalSendQueueBytes for
	// a peer over its share, twice that for any (see admitLocked).
	QueuedSendBytes int64
	// PeersReaped counts peers ended because they stopped draining their
	// queue (over a send bound, or stalled past SendTimeout); each is also
	// in PeersDown.
	PeersReaped uint64
	// InboundConns is the TCP connections our ROUTER holds now.
	InboundConns int64
	// InboundShut counts inbound connections we shut down: over
	// MaxInboundConnsPerHost or MaxInboundConnsPerNetwork, making room past
	// MaxInboundConns, or unheard past UnheardTimeout (libzmq never gave us
	// a frame from them).
	InboundShut uint64
	// InboundNotAdmitted counts, of those, the connections shut as they
	// were accepted because Options.AdmitAddr refused their address.
	InboundNotAdmitted uint64
}

type counters struct {
	framesIn, framesOut, droppedIn, droppedOut, peersUp, peersDown, peersReaped, inboundShut, notAdmitted atomic.Uint64
	openPeers, queuedBytes, inboundConns                                                                  atomic.Int64
}

// New binds the ROUTER at tcp://bindHost:port and starts the pump. localID is
// the identity peers will see and must be the "host:port" they dial.
func New(localID, bindHost string, port int, opts Options) (*Transport, error) {
	if _, err := parsePeerID(localID); err != nil {
		return nil, fmt.Errorf("zmqctl: local id: %w", err)
	}
	opts, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	bind, err := bindEndpoint(bindHost, port) // a host name is resolved here
	if err != nil {
		return nil, fmt.Errorf("zmqctl: %w", err)
	}
	t := &Transport{
		localID:  localID,
		bindAddr: bind.addr,
		opts:     opts,
		log:      opts.Logger.With("component", "zmqctl", "local", localID),
		events:   make(chan control.Event, opts.EventBuffer),
		done:     make(chan struct{}),
		adopted:  make(chan struct{}),
		queued:   make(map[string]queuedFrames),
	}
	p, err := newPump(t, bind)
	if err != nil {
		return nil, fmt.Errorf("zmqctl: %s: %w", bind.addr, err)
	}
	t.log.Info("control transport bound", "addr", bind.addr)
	t.pump = p
	go p.run()
	return t, nil
}

// LocalID returns the identity this transport sends with.
func (t *Transport) LocalID() string { return t.localID }

// BindAddr returns the ZMQ address the ROUTER is bound to.
func (t *Transport) BindAddr() string { return t.bindAddr }

// Events returns the inbound stream; it is closed once the pump has exited.
func (t *Transport) Events() <-chan control.Event { return t.events }

// Hand makes the pump call h for every event instead of sending it to
// Events; see control.Handing. It returns once the pump has switched (or
// stopped), so no event reaches Events after it; only the first call counts.
func (t *Transport) Hand(h func(control.Event)) {
	t.mu.Lock()
	if t.hand == nil {
		t.hand = h
	}
	t.mu.Unlock()
	t.wake.wake()
	select {
	case <-t.adopted:
	case <-t.done:
	}
}

// Connect opens the DEALER to peerID ahead of the first Send.
func (t *Transport) Connect(peerID string) error {
	return t.enqueue(cmdConnect, peerID, nil)
}

// Send queues a copy of frame for peerID, opening a DEALER if needed.
func (t *Transport) Send(peerID string, frame []byte) error {
	return t.enqueue(cmdSend, peerID, frame) // copied there unless libzmq took it
}

// Disconnect ends our use of the DEALER to peerID: frames already queued
// keep going out for up to Options.DisconnectLinger, after which it is
// closed; a Send or Connect before then takes it back, so the peer never
// sees two connections under our identity. Nothing about the peer is
// reported after Disconnect.
func (t *Transport) Disconnect(peerID string) {
	_ = t.enqueue(cmdDisconnect, peerID, nil)
}

// Redial closes the DEALER to peerID at once (linger 0, parked or not),
// so the next Send or Connect opens a fresh connection (after the usual
// settle: see Identity rules) instead of taking this one back. Nothing
// about the peer is reported.
func (t *Transport) Redial(peerID string) {
	_ = t.enqueue(cmdRedial, peerID, nil)
}

func (t *Transport) enqueue(kind commandKind, peerID string, frame []byte) error {
	ep, err := parsePeerID(peerID)
	if err != nil {
		return err
	}
	t.mu.Lock()
	if t.closing.Load() {
		t.mu.Unlock()
		return t.closedErr()
	}
	if kind == cmdSend {
		if err := t.admitLocked(peerID, frame); err != nil {
			t.mu.Unlock()
			t.counters.droppedOut.Add(1)
			return err
		}
		// The direct path: with nothing queued ahead of it and the peer's
		// DEALER open and not stalled, hand the frame to libzmq here. The
		// pump touches that DEALER only under mu and never while it waits,
		// so mu is the full memory barrier libzmq asks of a socket that
		// changes threads. Anything else takes the queue.
		if len(t.commands) == 0 && t.queued[peerID].frames == 0 && t.pump.sendDirect(peerID, frame) {
			t.mu.Unlock()
			return nil
		}
		q := t.queued[peerID]
		q.frames++
		q.bytes += frameCost(frame)
		t.queued[peerID] = q
		t.queuedBytes += frameCost(frame)
		t.counters.queuedBytes.Store(int64(t.queuedBytes))
	}
	if frame != nil {
		frame = bytes.Clone(frame)
	}
	t.commands = append(t.commands, command{kind: kind, peerID: peerID, ep: ep, frame: frame})
	t.mu.Unlock()
	t.wake.wake()
	return nil
}

// takeCommandsLocked hands the queued commands to the pump; mu is held.
func (t *Transport) takeCommandsLocked() []command {
	batch := t.commands
	t.commands = nil
	return batch
}

// admitLocked refuses a frame that would put peerID over a send bound:
// Options.SendHWM frames or Options.SendQueueBytes bytes waiting in front
// of libzmq for it, or, with Options.TotalSendQueueBytes waiting for all
// peers, more than its fair share of that (the total over the peers with
// frames waiting), so peers that stopped reading cannot starve one that
// reads; totalSendCeiling x TotalSendQueueBytes is the hard bound. A peer
// that stays over because it stopped reading is reported down by the
// pump once frames have waited for it for Options.SendTimeout
// (expireDeadlines). One frame is always admitted to an empty queue under
// the hard bound, whatever its size: the byte bounds limit what piles up,
// not the largest frame we may send.
func (t *Transport) admitLocked(peerID string, frame []byte) error {
	q, cost, o := t.queued[peerID], frameCost(frame), t.opts
	var over string
	switch {
	case q.frames >= o.SendHWM:
		over = fmt.Sprintf("%d frames waiting", q.frames)
	case q.frames > 0 && q.bytes+cost > o.SendQueueBytes:
		over = fmt.Sprintf("%d bytes waiting and %d more, bound %d", q.bytes, cost, o.SendQueueBytes)
	case q.frames > 0 && t.queuedBytes+cost > o.TotalSendQueueBytes && q.bytes+cost > o.TotalSendQueueBytes/len(t.queued):
		over = fmt.Sprintf("%d bytes waiting for all peers, bound %d, and %d for this one with %d more, over its share %d",
			t.queuedBytes, o.TotalSendQueueBytes, q.bytes, cost, o.TotalSendQueueBytes/len(t.queued))
	case t.queuedBytes > 0 && t.queuedBytes+cost > totalSendCeiling*o.TotalSendQueueBytes:
		over = fmt.Sprintf("%d bytes waiting for all peers and %d more, hard bound %d",
			t.queuedBytes, cost, totalSendCeiling*o.TotalSendQueueBytes)
	default:
		return nil
	}
	return fmt.Errorf("zmqctl: %w: %s (%s)", ErrSendQueueFull, peerID, over)
}

// totalSendCeiling: peers under their share may take what waits for all
// peers past TotalSendQueueBytes, up to this many times it.
const totalSendCeiling = 2

// releasedLocked is called by the pump, under mu, for queued frames libzmq
// accepted or that were discarded, making room for more Sends to peerID.
func (t *Transport) releasedLocked(peerID string, frames, bytes int) {
	if frames == 0 {
		return
	}
	q := t.queued[peerID]
	q.frames -= frames
	q.bytes -= bytes
	t.queuedBytes -= bytes
	t.counters.queuedBytes.Store(int64(t.queuedBytes))
	if q.frames <= 0 {
		delete(t.queued, peerID)
	} else {
		t.queued[peerID] = q
	}
}

// Close stops the pump, which closes every socket (linger 0, or the rest
// of its linger for a DEALER parked by Disconnect), frees the port and
// releases the process's ZMQ context, then closes Events. The last
// Transport of the process to close terminates the context, which waits
// for those lingering DEALERs, each for up to its Options.DisconnectLinger;
// Close allows for that on top of Options.CloseTimeout. Idempotent.
func (t *Transport) Close() error {
	t.closeOnce.Do(func() {
		t.stopAccepting()
		t.wake.wake()
	})
	bound := t.opts.CloseTimeout + processContext.lingerBound()
	timer := time.NewTimer(bound)
	defer timer.Stop()
	select {
	case <-t.done:
	case <-timer.C:
		return fmt.Errorf("zmqctl: %s: pump did not stop within %v", t.localID, bound)
	}
	if f := t.failure.Load(); f != nil {
		return *f
	}
	return nil
}

// Stats returns a snapshot of the counters.
func (t *Transport) Stats() Stats {
	c := &t.counters
	return Stats{
		FramesIn:           c.framesIn.Load(),
		FramesOut:          c.framesOut.Load(),
		DroppedInbound:     c.droppedIn.Load(),
		DroppedOutbound:    c.droppedOut.Load(),
		PeersUp:            c.peersUp.Load(),
		PeersDown:          c.peersDown.Load(),
		OpenPeers:          c.openPeers.Load(),
		QueuedSendBytes:    c.queuedBytes.Load(),
		PeersReaped:        c.peersReaped.Load(),
		InboundConns:       c.inboundConns.Load(),
		InboundShut:        c.inboundShut.Load(),
		InboundNotAdmitted: c.notAdmitted.Load(),
	}
}

func (t *Transport) closedErr() error {
	if f := t.failure.Load(); f != nil {
		return fmt.Errorf("%w: %v", control.ErrClosed, *f)
	}
	return control.ErrClosed
}

// fail records why the pump died and refuses further calls.
func (t *Transport) fail(err error) {
	t.failure.CompareAndSwap(nil, &err)
	t.stopAccepting()
}

// stopAccepting makes later calls fail with ErrClosed and drops the queue.
func (t *Transport) stopAccepting() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closing.Store(true)
	t.commands = nil
	clear(t.queued)
	t.queuedBytes = 0
	t.counters.queuedBytes.Store(0)
}

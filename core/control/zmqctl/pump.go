package zmqctl

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"
	"golang.org/x/sys/unix"

	"github.com/peerkv/peerkv/core/control"
)

const (
	// idlePoll caps a wait with nothing pending; wake-ups come from the
	// waker, so this is only a safety net and costs ~nothing.
	idlePoll = time.Second
	// backlogPoll is the retry period while the Events channel is full.
	backlogPoll = time.Millisecond
	// redialSettle is how long a new DEALER to a peer waits to dial after
	// the last one closed (pump.closed).
	redialSettle = 100 * time.Millisecond
	// routerBatch bounds ROUTER reads per iteration so commands stay prompt.
	routerBatch = 256
	// staleReady is how long the handed reads may take before the pump
	// polls again ahead of expiring deadlines.
	staleReady = time.Second
)

// fdKind says what a polled file descriptor belongs to.
type fdKind uint8

const (
	fdRouter fdKind = iota + 1
	fdWaker
	fdMonitor
	fdDealer        // a stalled DEALER, watched for room
	fdRouterMonitor // the ROUTER's monitor: connections accepted and ended
)

type fdTarget struct {
	kind fdKind
	pc   *peerConn
}

// pump owns every socket of a Transport and runs on one goroutine. It waits
// on an epoll set of the sockets' ZMQ_FD descriptors (no libzmq call while
// it waits), so registering a peer costs one epoll_ctl and a wake-up touches
// only what became ready. The epoll set is itself waited on through Go's
// network poller (see wait). Outside the ROUTER reads it works under t.mu,
// which also hands idle DEALERs to Send's direct path (see
// Transport.enqueue).
type pump struct {
	t        *Transport
	ctx      *zmq.Context
	router   *zmq.Socket
	routerFd int
	affinity uint64 // the I/O thread of this Transport's network sockets (nextAffinity)
	bound    bool   // the ROUTER holds its port

	peers map[string]*peerConn // guarded by t.mu
	// timed holds the peers with a running deadline (handshake or stalled
	// queue), so the walk per iteration is over those only.
	timed map[*peerConn]struct{}
	// closed holds, for each peer whose DEALER closed in the last
	// redialSettle, when a new DEALER to it may dial: a ROUTER without
	// handover never reads a second connection under our identity, and the
	// peer's may not have seen the last one end yet. Pruned as it expires.
	closed map[string]time.Time

	epfd       int
	epoll      *os.File // owns epfd once set: Go's poller watches it
	epollConn  syscall.RawConn
	fds        map[int32]fdTarget
	events     []unix.EpollEvent
	ready      []fdTarget // monitors and DEALERs that polled ready
	wakeFd     int
	routerMore bool
	// silentCheck is when yieldSilent wants to look again (restart.go).
	silentCheck time.Duration

	in                 *inbound // the ROUTER's connections
	routerMonitorReady bool

	backlog []control.Event // events waiting for room in t.events, or for hand
	// hand, once adopted from t.hand, takes every event on this goroutine,
	// never under t.mu (it may call Send): events raised under the lock
	// wait in backlog until the pump lets go of it.
	hand func(control.Event)
}

// newPump acquires the process's ZMQ context, binds the ROUTER and sets up
// the waker. It runs before the pump goroutine starts; the go statement
// hands the sockets over with the memory barrier libzmq requires.
func newPump(t *Transport, bind endpoint) (p *pump, err error) {
	ctx, err := processContext.acquire(t.opts.DisconnectLinger)
	if err != nil {
		return nil, err
	}
	p = &pump{t: t, ctx: ctx, affinity: nextAffinity(), epfd: -1, routerMore: true,
		peers: map[string]*peerConn{}, timed: map[*peerConn]struct{}{}, closed: map[string]time.Time{}, fds: map[int32]fdTarget{},
		events: make([]unix.EpollEvent, 64), in: newInbound()}
	defer func() {
		if err != nil {
			p.closeSockets()
			_ = processContext.release(ctx)
			p = nil
		}
	}()
	if p.router, err = newSocket(ctx, zmq.ROUTER); err != nil {
		return p, err
	}
	if err = p.configureRouter(bind); err != nil {
		return p, err
	}
	if err = p.monitorRouter(); err != nil {
		return p, err
	}
	if err = p.router.Bind(bind.addr); err != nil {
		return p, fmt.Errorf("bind %s: %w", bind.addr, err)
	}
	p.bound = true
	if p.in.localPort, err = boundPort(p.router); err != nil {
		return p, err
	}
	if err = p.openEpoll(); err != nil {
		return p, err
	}
	if t.wake, err = newWaker(); err != nil {
		return p, fmt.Errorf("waker: %w", err)
	}
	p.wakeFd = t.wake.fd
	if err = p.watch(p.wakeFd, fdTarget{kind: fdWaker}, unix.EPOLLIN); err != nil {
		return p, err
	}
	if p.routerFd, err = p.router.GetFd(); err != nil {
		return p, fmt.Errorf("router fd: %w", err)
	}
	// Edge-triggered: the ROUTER is read until EAGAIN (routerMore says when
	// it was not), and under back-pressure it is simply not read.
	if err = p.watch(p.routerFd, fdTarget{kind: fdRouter}, unix.EPOLLIN|unix.EPOLLET); err != nil {
		return p, err
	}
	if err = p.watchRouterMonitor(); err != nil {
		return p, err
	}
	return p, nil
}

// boundPort is the TCP port the ROUTER listens on.
func boundPort(router *zmq.Socket) (uint16, error) {
	endpoint, err := router.GetLastEndpoint()
	if err != nil {
		return 0, fmt.Errorf("router endpoint: %w", err)
	}
	ap, err := netip.ParseAddrPort(strings.TrimPrefix(endpoint, "tcp://"))
	if err != nil {
		return 0, fmt.Errorf("router endpoint %q: %w", endpoint, err)
	}
	return ap.Port(), nil
}

// openEpoll creates the epoll set, non-blocking, and hands it to Go's
// network poller: an epoll descriptor is readable while events are ready.
func (p *pump) openEpoll() error {
	fd, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return fmt.Errorf("epoll_create1: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		_ = unix.Close(fd)
		return fmt.Errorf("epoll set non-blocking: %w", err)
	}
	p.epfd, p.epoll = fd, os.NewFile(uintptr(fd), "zmqctl-epoll")
	// A deadline can be set only on a file the poller took.
	if err := p.epoll.SetReadDeadline(time.Time{}); err != nil {
		return fmt.Errorf("epoll set is not pollable by the Go runtime: %w", err)
	}
	if p.epollConn, err = p.epoll.SyscallConn(); err != nil {
		return fmt.Errorf("epoll raw conn: %w", err)
	}
	return nil
}

// watch adds fd to the epoll set. A ZMQ_FD is readable when the socket has
// commands to process; the reader must then ask libzmq (recv, ZMQ_EVENTS)
// until it says there is nothing left, which also resets the fd.
func (p *pump) watch(fd int, target fdTarget, events uint32) error {
	if err := unix.EpollCtl(p.epfd, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: events, Fd: int32(fd)}); err != nil {
		return fmt.Errorf("epoll add: %w", err)
	}
	p.fds[int32(fd)] = target
	return nil
}

func (p *pump) unwatch(fd int) {
	if fd < 0 {
		return
	}
	if _, ok := p.fds[int32(fd)]; !ok {
		return
	}
	delete(p.fds, int32(fd))
	_ = unix.EpollCtl(p.epfd, unix.EPOLL_CTL_DEL, fd, nil)
}

func (p *pump) configureRouter(bind endpoint) error {
	if err := p.router.SetAffinity(p.affinity); err != nil {
		return fmt.Errorf("set router affinity: %w", err)
	}
	if err := p.router.SetRouterMandatory(1); err != nil {
		return fmt.Errorf("set router mandatory: %w", err)
	}
	// Frames each connection may queue in libzmq before TCP pushes back on
	// its sender (libzmq's default is 1000, each up to MaxFrameBytes).
	if err := p.router.SetRcvhwm(p.t.opts.RecvHWM); err != nil {
		return fmt.Errorf("set router receive hwm: %w", err)
	}
	// Under CURVE a new connection under a routing id in use takes it over
	// (the old one is no longer read): a member that restarted before we saw
	// its old link close is heard at once. Without handover libzmq consumes
	// the new connection's routing id, finds it taken and never reads that
	// connection again. Plaintext keeps it off, as vLLM: there anyone could
	// dial under an established peer's id and leave it unheard until the
	// heartbeat closes its connection, again and again.
	if err := p.router.SetRouterHandover(p.t.opts.Curve != nil); err != nil {
		return fmt.Errorf("set router handover: %w", err)
	}
	if err := p.router.SetIpv6(bind.ipv6); err != nil {
		return fmt.Errorf("set ipv6: %w", err)
	}
	// Checked by libzmq's decoder on the frame header, before it allocates.
	if err := p.router.SetMaxmsgsize(maxMsgSize(p.t.opts)); err != nil {
		return fmt.Errorf("set max message size: %w", err)
	}
	if err := secureRouter(p.router, p.t.opts); err != nil {
		return err
	}
	// Its own pings reap a dialer that vanished (host lost, link cut): the
	// dialer's TTL cannot, as libzmq cancels that timer on any message and
	// re-arms it only on the next PING, and a dead connection would hold
	// the peer's identity from its restarted self forever.
	return heartbeat(p.router, p.t.opts)
}

func (p *pump) run() {
	t := p.t
	locked := false
	defer func() {
		if locked {
			t.mu.Unlock()
		}
		if r := recover(); r != nil {
			err := fmt.Errorf("zmqctl: %s: pump panicked: %v", t.localID, r)
			t.log.Error("control transport died", "panic", r, "stack", string(debug.Stack()))
			t.fail(err)
		}
		p.shutdown()
		close(t.events)
		close(t.done)
	}()
	for {
		if t.opts.pumpHook != nil {
			t.opts.pumpHook()
		}
		t.mu.Lock()
		locked = true
		if t.closing.Load() {
			t.mu.Unlock()
			locked = false
			return
		}
		if p.hand == nil && t.hand != nil {
			p.adoptHand(t.hand)
		}
		p.flushBacklog()
		p.handleReady()
		if p.routerMonitorReady {
			p.routerMonitorReady = false
			p.readRouterMonitor()
		}
		p.runCommands(t.takeCommandsLocked())
		now := time.Now()
		p.expireDeadlines(now)
		p.expireUnheard(now)
		p.silentCheck = p.yieldSilent(now, idlePoll)
		timeout := p.pollTimeout(now)
		t.mu.Unlock()
		locked = false
		p.handBacklog()
		if err := p.wait(timeout); err != nil {
			t.log.Error("control transport died", "err", err)
			t.fail(err)
			return
		}
		if p.routerMore && len(p.backlog) == 0 {
			start := time.Now()
			p.readRouter()
			if p.hand != nil && time.Since(start) > staleReady {
				// The handler held the pump long enough for a deadline to
				// pass while its cure (a finished handshake, room on a
				// stalled DEALER) waited unpolled: look again first.
				if err := p.wait(0); err != nil {
					t.log.Error("control transport died", "err", err)
					t.fail(err)
					return
				}
			}
		}
	}
}

// wait parks until a wake-up, ROUTER input, a monitor event, room on a
// stalled DEALER or the next deadline, and notes what is ready.
//
// The pump parks in Go's network poller, not in a blocking epoll_wait: a
// thread blocked in a syscall keeps its P, and a goroutine another thread
// readied (the tier's loop, woken by a host call returning to C) waited in
// that P's run queue until sysmon took the P back, up to 10 ms, on a host
// with few Ps. Parked, the pump leaves its P free to run it at once.
func (p *pump) wait(timeout time.Duration) error {
	n, polls := 0, 0
	var werr error
	poll := func(fd uintptr) bool {
		polls++
		n, werr = unix.EpollWait(int(fd), p.events, 0)
		return n > 0 || werr != nil
	}
	if timeout == 0 {
		poll(uintptr(p.epfd))
	} else {
		if err := p.epoll.SetReadDeadline(time.Now().Add(timeout)); err != nil {
			return fmt.Errorf("epoll deadline: %w", err)
		}
		if err := p.epollConn.Read(poll); err != nil && !errors.Is(err, os.ErrDeadlineExceeded) {
			return fmt.Errorf("wait on epoll: %w", err)
		}
	}
	if timeout == 0 || (polls == 1 && (n > 0 || werr != nil)) {
		// Carrying on without parking: let a goroutine the last pass
		// readied (an Events reader) run first, as parking would.
		runtime.Gosched()
	}
	if werr != nil {
		if errors.Is(werr, unix.EINTR) {
			return nil
		}
		return fmt.Errorf("epoll_wait: %w", werr)
	}
	woken := false
	for _, ev := range p.events[:n] {
		target, ok := p.fds[ev.Fd]
		if !ok {
			continue
		}
		switch target.kind {
		case fdRouter:
			p.routerMore = true
		case fdWaker:
			p.t.wake.drain()
			woken = true
		case fdRouterMonitor:
			p.routerMonitorReady = true
		default:
			p.ready = append(p.ready, target)
		}
	}
	if woken {
		// Cleared after draining and before takeCommands: see waker.consumed.
		p.t.wake.consumed()
	}
	return nil
}

// handleReady serves the monitors and stalled DEALERs that polled ready.
func (p *pump) handleReady() {
	for i, r := range p.ready {
		p.ready[i] = fdTarget{}
		if p.peers[r.pc.id] != r.pc || r.pc.monitor == nil {
			continue // gone since
		}
		switch r.kind {
		case fdMonitor:
			p.readMonitor(r.pc)
		case fdDealer:
			if r.pc.stalledSince.IsZero() {
				continue
			}
			// ZMQ_EVENTS processes the DEALER's commands, resetting its fd.
			if ev, err := r.pc.dealer.GetEvents(); err != nil {
				p.peerDown(r.pc, fmt.Errorf("%w: events: %v", ErrSocket, err))
			} else if ev&zmq.POLLOUT != 0 {
				p.flushPeer(r.pc)
			}
		}
	}
	p.ready = p.ready[:0]
}

// retime keeps pc in the timed set while it has a deadline.
func (p *pump) retime(pc *peerConn) {
	if pc.deadline.IsZero() && pc.stalledSince.IsZero() && !pc.parked() && pc.dialAt.IsZero() {
		delete(p.timed, pc)
	} else {
		p.timed[pc] = struct{}{}
	}
}

func (p *pump) pollTimeout(now time.Time) time.Duration {
	if len(p.backlog) > 0 && p.hand == nil {
		return backlogPoll
	}
	if p.routerMore {
		return 0
	}
	timeout := p.unheardTimeout(now, idlePoll)
	timeout = min(timeout, p.silentCheck)
	for pc := range p.timed {
		if !pc.deadline.IsZero() {
			timeout = min(timeout, pc.deadline.Sub(now))
		}
		if !pc.stalledSince.IsZero() {
			timeout = min(timeout, pc.stalledSince.Add(p.t.opts.SendTimeout).Sub(now))
		}
		if pc.parked() {
			timeout = min(timeout, pc.parkedUntil.Sub(now))
		}
		if !pc.dialAt.IsZero() {
			timeout = min(timeout, pc.dialAt.Sub(now))
		}
	}
	return max(timeout, 0)
}

// readRouter runs without t.mu: only the pump touches the ROUTER.
func (p *pump) readRouter() {
	for range routerBatch {
		if len(p.backlog) > 0 {
			return
		}
		msg, err := recvRouterMessage(p.router)
		if err != nil {
			if isAgain(err) {
				p.routerMore = false // drained: the next message raises an edge
				p.in.drainedAt = time.Now()
			} else {
				p.t.log.Warn("router receive failed", "err", err)
			}
			return
		}
		p.heard(msg.fd)
		if msg.parts != 2 {
			p.t.counters.droppedIn.Add(1)
			p.t.log.Warn("dropping message with wrong frame count", "frames", msg.parts, "want", 2)
			continue
		}
		p.t.counters.framesIn.Add(1)
		ev := control.Event{Kind: control.EventFrame, PeerID: string(msg.identity), Addr: msg.addr, Frame: msg.payload}
		if p.hand != nil {
			p.hand(ev) // without t.mu, behind nothing: handBacklog ran before this wait
			continue
		}
		p.emit(ev)
	}
}

func (p *pump) readMonitor(pc *peerConn) {
	for {
		event, _, _, err := pc.monitor.RecvEvent(zmq.DONTWAIT)
		if err != nil {
			if !isAgain(err) {
				p.peerDown(pc, fmt.Errorf("%w: monitor: %v", ErrSocket, err))
			}
			return
		}
		switch {
		case event&handshakeFailures != 0:
			// libzmq names no cause; in practice the ends disagree on encrypt.
			p.peerDown(pc, &control.ConnectError{Cause: control.CauseEncryptMismatch, Err: fmt.Errorf("%w (%v): %s",
				ErrPeerDisconnected, event, encryptMismatch(p.t.opts.Curve != nil, "the peer "+pc.id))})
			return
		case event&fatalEvents != 0:
			p.peerDown(pc, connectFailure(pc, event, fmt.Errorf("%w (%v)", ErrPeerDisconnected, event)))
			return
		case event&zmq.EVENT_HANDSHAKE_SUCCEEDED != 0 && !pc.deadline.IsZero():
			pc.deadline = time.Time{}
			p.retime(pc)
			p.t.counters.peersUp.Add(1)
			p.t.log.Debug("peer connected", "peer", pc.id)
		}
	}
}

func (p *pump) runCommands(batch []command) {
	for _, c := range batch {
		switch c.kind {
		case cmdConnect:
			p.peer(c.peerID, c.ep)
		case cmdSend:
			p.send(c)
		case cmdDisconnect:
			if pc := p.peers[c.peerID]; pc != nil && !pc.parked() {
				p.park(pc)
				p.t.log.Info("peer disconnected on request", "peer", c.peerID)
			}
		case cmdRedial:
			if pc := p.peers[c.peerID]; pc != nil {
				p.forget(pc, 0)
				p.t.log.Info("peer connection dropped for a fresh dial", "peer", c.peerID)
			}
		}
	}
}

// sendDirect is Send's path around the queue, called with t.mu held: it
// hands frame to an open, unstalled DEALER (only the pump polls a stalled
// one) and reports whether libzmq took it. On EAGAIN or an error the frame
// takes the queue and the pump stalls or drops the peer as usual.
func (p *pump) sendDirect(peerID string, frame []byte) bool {
	pc := p.peers[peerID]
	if pc == nil || pc.parked() || !pc.dialAt.IsZero() || len(pc.pending) > 0 || !pc.stalledSince.IsZero() {
		return false // a parked peer is taken back by the pump (peer)
	}
	if _, err := pc.dealer.SendBytes(frame, zmq.DONTWAIT); err != nil {
		return false
	}
	p.t.counters.framesOut.Add(1)
	return true
}

func (p *pump) send(c command) {
	pc := p.peer(c.peerID, c.ep)
	if pc == nil {
		p.t.counters.droppedOut.Add(1)
		p.t.releasedLocked(c.peerID, 1, frameCost(c.frame))
		return
	}
	pc.pending = append(pc.pending, c.frame)
	p.flushPeer(pc)
}

// flushPeer hands pending frames to the DEALER until libzmq's queue is
// full. Its accounting of what the I/O thread consumed lags, so a full
// queue is not yet a dead peer: the rest waits for POLLOUT, up to
// SendTimeout.
func (p *pump) flushPeer(pc *peerConn) {
	if !pc.dialAt.IsZero() {
		// Not connected yet: libzmq would refuse with EAGAIN and the stall
		// clock would start early. The dial flushes (expireDeadlines).
		return
	}
	sent, sentBytes := 0, 0
	defer func() {
		p.t.counters.framesOut.Add(uint64(sent))
		p.t.releasedLocked(pc.id, sent, sentBytes)
	}()
	for len(pc.pending) > 0 {
		_, err := pc.dealer.SendBytes(pc.pending[0], zmq.DONTWAIT)
		if isAgain(err) {
			if pc.stalledSince.IsZero() {
				pc.stalledSince = time.Now()
				p.retime(pc)
				p.watchDealer(pc) // start watching for room
			}
			return
		}
		if err != nil {
			p.peerDown(pc, fmt.Errorf("%w: send: %v", ErrSocket, err))
			return
		}
		sentBytes += frameCost(pc.pending[0])
		pc.pending[0] = nil
		pc.pending = pc.pending[1:]
		sent++
	}
	pc.pending = nil
	if !pc.stalledSince.IsZero() {
		pc.stalledSince = time.Time{}
		p.retime(pc)
		p.unwatch(pc.dealerFd)
		pc.dealerFd = -1
	}
}

// watchDealer polls a stalled DEALER's fd; level-triggered, as ZMQ_EVENTS
// resets it each time it fires. Without an fd the deadline still bounds
// the stall.
func (p *pump) watchDealer(pc *peerConn) {
	fd, err := pc.dealer.GetFd()
	if err == nil {
		err = p.watch(fd, fdTarget{kind: fdDealer, pc: pc}, unix.EPOLLIN)
	}
	if err != nil {
		p.t.log.Warn("cannot watch stalled dealer", "peer", pc.id, "err", err)
		return
	}
	pc.dealerFd = fd
}

// peer returns the open DEALER to peerID, opening one if needed; on failure
// it reports the peer down and returns nil.
func (p *pump) peer(peerID string, ep endpoint) *peerConn {
	if pc := p.peers[peerID]; pc != nil {
		if pc.parked() {
			pc.parkedUntil = time.Time{}
			p.retime(pc)
			p.t.log.Debug("peer taken back after its disconnect", "peer", peerID)
		}
		return pc
	}
	// The hold stays recorded (expireDeadlines prunes it): an open that
	// fails must not let the next one dial at once.
	var dialAt time.Time
	if until, ok := p.closed[peerID]; ok && time.Now().Before(until) {
		dialAt = until
	}
	pc, err := openPeerAt(p.ctx, p.affinity, p.t.localID, peerID, ep, nextMonitorAddr(), p.t.opts, dialAt)
	if err != nil {
		p.reportDown(peerID, fmt.Errorf("%w: %v", ErrSocket, err))
		return nil
	}
	p.peers[peerID] = pc
	p.retime(pc)
	p.t.counters.openPeers.Add(1)
	if err := p.watchMonitor(pc); err != nil {
		p.peerDown(pc, fmt.Errorf("%w: %v", ErrSocket, err))
		return nil
	}
	if p.peers[peerID] != pc {
		// The monitor already told of a refused connection and the peer
		// was reported down; it must not be used, or reported, again.
		return nil
	}
	p.t.log.Debug("dialing peer", "peer", peerID, "addr", ep.addr)
	return pc
}

// watchMonitor polls the monitor's fd, then reads what is already there:
// the monitor's pipe was attached by connect, not by a command, so the
// events written before its first read raise no fd wake-up of their own.
func (p *pump) watchMonitor(pc *peerConn) error {
	fd, err := pc.monitor.GetFd()
	if err != nil {
		return fmt.Errorf("monitor fd: %w", err)
	}
	if err := p.watch(fd, fdTarget{kind: fdMonitor, pc: pc}, unix.EPOLLIN); err != nil {
		return err
	}
	pc.monitorFd = fd
	p.readMonitor(pc)
	return nil
}

// expireDeadlines reports peers whose handshake or stalled send queue
// outlived its deadline.
func (p *pump) expireDeadlines(now time.Time) {
	o := p.t.opts
	for id, until := range p.closed {
		if !now.Before(until) {
			delete(p.closed, id)
		}
	}
	for pc := range p.timed {
		switch {
		case !pc.dialAt.IsZero() && !now.Before(pc.dialAt):
			if err := pc.dial(); err != nil {
				p.peerDown(pc, fmt.Errorf("%w: %v", ErrSocket, err))
				continue
			}
			if pc.parked() {
				// Its whole linger runs from the dial, even when the pump
				// got here late (a loaded host): the goodbye must go out.
				pc.parkedUntil = now.Add(o.DisconnectLinger)
			}
			p.retime(pc)
			if len(pc.pending) > 0 {
				p.flushPeer(pc) // connect attached the pipe: no fd wake-up tells of the room
			}
		case pc.parked() && !now.Before(pc.parkedUntil):
			p.forget(pc, 0) // its linger is over
		case !pc.deadline.IsZero() && now.After(pc.deadline):
			p.peerDown(pc, &control.ConnectError{Cause: control.CauseTimeout, Unsure: true,
				Err: fmt.Errorf("%w: no ZMTP handshake within %v", ErrConnectTimeout, o.ConnectTimeout)})
		case !pc.stalledSince.IsZero() && now.Sub(pc.stalledSince) > o.SendTimeout:
			p.reap(pc, fmt.Errorf("%w: %d frames waited %v for room", ErrSendQueueFull, len(pc.pending), o.SendTimeout))
		}
	}
}

// reap ends a peer that stopped draining what we send it: its DEALER
// closes with linger 0, so libzmq frees its queue, and the frames waiting
// in front of it are dropped.
func (p *pump) reap(pc *peerConn, err error) {
	p.t.counters.peersReaped.Add(1)
	p.t.log.Warn("dropping a peer that stopped reading", "peer", pc.id, "err", err)
	p.peerDown(pc, err)
}

func (p *pump) peerDown(pc *peerConn, err error) {
	p.forget(pc, 0)
	if !pc.parked() { // its owner is done with it
		p.reportDown(pc.id, err)
	}
}

// park ends the owner's use of pc (Disconnect): see peerConn.parkedUntil.
// Frames still waiting in front of libzmq keep going out meanwhile.
func (p *pump) park(pc *peerConn) {
	// A DEALER still held back gets its whole linger after it dials.
	from := time.Now()
	if pc.dialAt.After(from) {
		from = pc.dialAt
	}
	pc.parkedUntil = from.Add(p.t.opts.DisconnectLinger)
	p.retime(pc)
}

func (p *pump) reportDown(peerID string, err error) {
	p.t.counters.peersDown.Add(1)
	p.t.log.Info("peer down", "peer", peerID, "err", err) // the owner logs the event it gets
	p.emit(control.Event{Kind: control.EventPeerDown, PeerID: peerID, Err: err})
}

// forget closes the DEALER and discards the frames still waiting in front
// of it; those already in libzmq's queue get up to linger to go out.
func (p *pump) forget(pc *peerConn, linger time.Duration) {
	p.t.counters.droppedOut.Add(uint64(len(pc.pending)))
	pendingBytes := 0
	for _, f := range pc.pending {
		pendingBytes += frameCost(f)
	}
	p.t.releasedLocked(pc.id, len(pc.pending), pendingBytes)
	pc.pending = nil
	delete(p.peers, pc.id)
	delete(p.timed, pc)
	p.unwatch(pc.monitorFd) // before the sockets close and free their fds
	p.unwatch(pc.dealerFd)
	pc.close(linger)
	p.t.counters.openPeers.Add(-1)
	p.closed[pc.id] = time.Now().Add(redialSettle)
}

// emit queues an event behind any backlog, so events stay in order; once
// handing, every event it raises waits for handBacklog.
func (p *pump) emit(ev control.Event) {
	if len(p.backlog) == 0 && p.hand == nil {
		select {
		case p.t.events <- ev:
			return
		default:
		}
	}
	p.backlog = append(p.backlog, ev)
}

func (p *pump) flushBacklog() {
	if p.hand != nil {
		return // handBacklog's, once the lock is let go
	}
	for len(p.backlog) > 0 {
		select {
		case p.t.events <- p.backlog[0]:
			p.backlog[0] = control.Event{}
			p.backlog = p.backlog[1:]
		default:
			return
		}
	}
	p.backlog = nil
}

// adoptHand switches to handing events to h, called with t.mu held: the
// events already in t.events go first (nobody reads it before Hand).
func (p *pump) adoptHand(h func(control.Event)) {
	var waiting []control.Event
	for drained := false; !drained; {
		select { // never blocks, even if someone reads Events against the contract
		case ev := <-p.t.events:
			waiting = append(waiting, ev)
		default:
			drained = true
		}
	}
	p.backlog = append(waiting, p.backlog...)
	p.hand = h
	close(p.t.adopted) // Hand returns: nothing goes to Events any more
}

// handBacklog hands over the events raised under t.mu, in order; it runs
// without the lock.
func (p *pump) handBacklog() {
	if p.hand == nil {
		return
	}
	for len(p.backlog) > 0 {
		ev := p.backlog[0]
		p.backlog[0] = control.Event{}
		p.backlog = p.backlog[1:]
		p.hand(ev)
	}
	p.backlog = nil
}

// shutdown closes every socket and releases the shared context (the last
// Transport's release terminates it). It must not panic out of the pump's
// deferred cleanup.
func (p *pump) shutdown() {
	defer func() {
		if r := recover(); r != nil {
			p.t.log.Error("control transport shutdown panicked", "panic", r)
		}
	}()
	p.t.stopAccepting()
	p.closeSockets()
	// Not reached when closing panicked: a socket left open would hold the
	// last Transport's Term forever, so the context is kept instead.
	if err := processContext.release(p.ctx); err != nil {
		p.t.log.Warn("zmq context release failed", "err", err)
	}
	p.t.log.Info("control transport closed")
}

func (p *pump) closeSockets() {
	p.closePeers()
	p.closeRouter()
	if p.t.wake != nil {
		p.t.wake.close()
	}
	if p.epoll != nil { // set with epfd, which it owns
		_ = p.epoll.Close() // takes epfd out of Go's poller, then closes it
		p.epoll = nil
	}
	p.epfd = -1
}

// closePeers runs under t.mu, which Send's direct path takes to use a
// DEALER.
func (p *pump) closePeers() {
	p.t.mu.Lock()
	defer p.t.mu.Unlock()
	now := time.Now()
	for _, pc := range p.peers {
		// As vLLM, closing does not wait for peers; a goodbye to a parked
		// one keeps the rest of its linger (the context's end waits for it).
		p.forget(pc, max(pc.parkedUntil.Sub(now), 0))
	}
}

// peerAddressProperty is libzmq's ZMQ_MSG_PROPERTY_PEER_ADDRESS: the
// numeric IP of the TCP connection a message came in on, from getpeername.
const peerAddressProperty = "Peer-Address"

// routerMessage is what the pump keeps of one ROUTER message: the first
// two parts, the part count and the source address.
type routerMessage struct {
	identity, payload []byte
	parts             int
	addr              string
	fd                int // the TCP connection's descriptor, -1 if libzmq gave none
}

// recvRouterMessage reads one whole message. Parts past the second are
// read and dropped, so a message of many parts costs no Go memory. The
// identity part carries no metadata when libzmq prefetched the message,
// so the address is asked of every part until one has it.
func recvRouterMessage(sock *zmq.Socket) (msg routerMessage, err error) {
	want := []string{peerAddressProperty, fdProperty}
	msg.fd = -1
	for {
		part, meta, err := sock.RecvBytesWithMetadata(zmq.DONTWAIT, want...)
		if err != nil {
			return msg, err
		}
		switch msg.parts++; msg.parts {
		case 1:
			msg.identity = part
		case 2:
			msg.payload = part
		default:
			msg.payload = nil
		}
		if msg.addr == "" {
			if msg.addr = peerAddress(meta); msg.addr != "" {
				msg.fd = messageFd(meta)
				want = nil
			}
		}
		if more, err := sock.GetRcvmore(); err != nil || !more {
			return msg, err
		}
	}
}

// peerAddress returns the remote IP libzmq reported, IPv4-mapped IPv6
// written as IPv4 so one host has one spelling; "" if there is none.
func peerAddress(meta map[string]string) string {
	addr, err := netip.ParseAddr(meta[peerAddressProperty])
	if err != nil {
		return ""
	}
	return addr.Unmap().String()
}

func isAgain(err error) bool {
	return errors.Is(err, syscall.EAGAIN) || zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN)
}

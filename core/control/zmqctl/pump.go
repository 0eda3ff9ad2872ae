package zmqctl

import (
	"errors"
	"fmt"
	"net/netip"
	"runtime"
	"runtime/debug"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/peerkv/peerkv/core/control"
)

const (
	// idlePoll caps a poll with nothing pending; wake-ups come from the
	// waker, so this is only a safety net and costs ~nothing.
	idlePoll = time.Second
	// backlogPoll is the retry period while the Events channel is full.
	backlogPoll = time.Millisecond
	// routerBatch bounds ROUTER reads per iteration so commands stay prompt.
	routerBatch = 256
)

// pump owns every socket of a Transport and runs on one goroutine.
type pump struct {
	t        *Transport
	ctx      *zmq.Context
	router   *zmq.Socket
	wakeRecv *zmq.Socket

	peers     map[string]*peerConn
	byMonitor map[*zmq.Socket]*peerConn
	byDealer  map[*zmq.Socket]*peerConn // stalled DEALERs polled for POLLOUT
	monitorN  uint64

	poller      *zmq.Poller
	routerIndex int
	pollerStale bool

	backlog []control.Event // events waiting for room in t.events
}

// newPump creates the context, binds the ROUTER and sets up the waker. It
// runs before the pump goroutine starts; the go statement hands the sockets
// over with the memory barrier libzmq requires.
func newPump(t *Transport, bind endpoint) (p *pump, err error) {
	ctx, err := zmq.NewContext()
	if err != nil {
		return nil, fmt.Errorf("new zmq context: %w", err)
	}
	p = &pump{t: t, ctx: ctx, pollerStale: true,
		peers: map[string]*peerConn{}, byMonitor: map[*zmq.Socket]*peerConn{}, byDealer: map[*zmq.Socket]*peerConn{}}
	defer func() {
		if err != nil {
			p.closeSockets()
			_ = ctx.Term()
			p = nil
		}
	}()
	// Sockets made by libzmq itself (monitors) get linger 0 too.
	if err = ctx.SetBlocky(false); err != nil {
		return p, fmt.Errorf("set context blocky: %w", err)
	}
	if p.router, err = newSocket(ctx, zmq.ROUTER); err != nil {
		return p, err
	}
	if err = p.configureRouter(bind); err != nil {
		return p, err
	}
	if err = p.router.Bind(bind.addr); err != nil {
		return p, fmt.Errorf("bind %s: %w", bind.addr, err)
	}
	wakeAddr := fmt.Sprintf("inproc://peerkv-zmqctl-wake-%p", p)
	if t.wake, p.wakeRecv, err = newWaker(ctx, wakeAddr); err != nil {
		return p, fmt.Errorf("waker: %w", err)
	}
	return p, nil
}

func (p *pump) configureRouter(bind endpoint) error {
	if err := p.router.SetRouterMandatory(1); err != nil {
		return fmt.Errorf("set router mandatory: %w", err)
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
	return heartbeat(p.router, p.t.opts)
}

func (p *pump) run() {
	t := p.t
	defer func() {
		if r := recover(); r != nil {
			err := fmt.Errorf("zmqctl: %s: pump panicked: %v", t.localID, r)
			t.log.Error("control transport died", "panic", r, "stack", string(debug.Stack()))
			t.fail(err)
		}
		p.shutdown()
		close(t.events)
		close(t.done)
	}()
	for !t.closing.Load() {
		if t.opts.pumpHook != nil {
			t.opts.pumpHook()
		}
		p.flushBacklog()
		if err := p.pollOnce(); err != nil {
			t.log.Error("control transport died", "err", err)
			t.fail(err)
			return
		}
		p.runCommands(t.takeCommands())
		p.expireDeadlines(time.Now())
	}
}

// pollOnce waits for ROUTER input, a wake-up, a monitor event or the next
// deadline, and handles what became readable.
func (p *pump) pollOnce() error {
	if p.pollerStale {
		p.rebuildPoller()
	}
	routerEvents := zmq.POLLIN
	if len(p.backlog) > 0 {
		routerEvents = 0 // back-pressure: leave frames in libzmq
	}
	if _, err := p.poller.Update(p.routerIndex, routerEvents); err != nil {
		return fmt.Errorf("poller update: %w", err)
	}
	// zmq_poll blocks in cgo while this goroutine's P stays attached; a
	// goroutine we just woke (an Events reader) would wait in that P's run
	// queue until sysmon retakes it (20 µs to 10 ms). Yield first.
	runtime.Gosched()
	ready, err := p.poller.Poll(p.pollTimeout(time.Now()))
	if err != nil {
		return fmt.Errorf("poll: %w", err)
	}
	for _, r := range ready {
		switch r.Socket {
		case p.router:
			p.readRouter()
		case p.wakeRecv:
			p.drainWaker()
		default:
			if pc := p.byMonitor[r.Socket]; pc != nil {
				p.readMonitor(pc)
			} else if pc := p.byDealer[r.Socket]; pc != nil && p.peers[pc.id] == pc {
				p.flushPeer(pc)
			}
		}
	}
	// Cleared after draining and before takeCommands: see waker.consumed.
	p.t.wake.consumed()
	return nil
}

func (p *pump) rebuildPoller() {
	p.poller = zmq.NewPoller()
	p.routerIndex = p.poller.Add(p.router, zmq.POLLIN)
	p.poller.Add(p.wakeRecv, zmq.POLLIN)
	clear(p.byDealer)
	for mon, pc := range p.byMonitor {
		p.poller.Add(mon, zmq.POLLIN)
		if !pc.stalledSince.IsZero() {
			p.poller.Add(pc.dealer, zmq.POLLOUT)
			p.byDealer[pc.dealer] = pc
		}
	}
	p.pollerStale = false
}

func (p *pump) pollTimeout(now time.Time) time.Duration {
	if len(p.backlog) > 0 {
		return backlogPoll
	}
	timeout := idlePoll
	for _, pc := range p.peers {
		if !pc.deadline.IsZero() {
			timeout = min(timeout, pc.deadline.Sub(now))
		}
		if !pc.stalledSince.IsZero() {
			timeout = min(timeout, pc.stalledSince.Add(p.t.opts.SendTimeout).Sub(now))
		}
	}
	// pebbe rounds down to milliseconds, and 0 would not block at all.
	return max(timeout, time.Millisecond)
}

func (p *pump) drainWaker() {
	for {
		if _, err := p.wakeRecv.RecvBytes(zmq.DONTWAIT); err != nil {
			return
		}
	}
}

func (p *pump) readRouter() {
	for range routerBatch {
		if len(p.backlog) > 0 {
			return
		}
		msg, err := recvRouterMessage(p.router)
		if err != nil {
			if !isAgain(err) {
				p.t.log.Warn("router receive failed", "err", err)
			}
			return
		}
		if msg.parts != 2 {
			p.t.counters.droppedIn.Add(1)
			p.t.log.Warn("dropping message with wrong frame count", "frames", msg.parts, "want", 2)
			continue
		}
		p.t.counters.framesIn.Add(1)
		p.emit(control.Event{Kind: control.EventFrame, PeerID: string(msg.identity), Addr: msg.addr, Frame: msg.payload})
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
		case event&fatalEvents != 0:
			p.peerDown(pc, fmt.Errorf("%w (%v)", ErrPeerDisconnected, event))
			return
		case event&zmq.EVENT_HANDSHAKE_SUCCEEDED != 0 && !pc.deadline.IsZero():
			pc.deadline = time.Time{}
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
			if pc := p.peers[c.peerID]; pc != nil {
				p.forget(pc, p.t.opts.DisconnectLinger)
				p.t.log.Info("peer disconnected on request", "peer", c.peerID)
			}
		}
	}
}

func (p *pump) send(c command) {
	pc := p.peer(c.peerID, c.ep)
	if pc == nil {
		p.t.counters.droppedOut.Add(1)
		p.t.released(c.peerID, 1)
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
	sent := 0
	defer func() {
		p.t.counters.framesOut.Add(uint64(sent))
		p.t.released(pc.id, sent)
	}()
	for len(pc.pending) > 0 {
		_, err := pc.dealer.SendBytes(pc.pending[0], zmq.DONTWAIT)
		if isAgain(err) {
			if pc.stalledSince.IsZero() {
				pc.stalledSince = time.Now()
				p.pollerStale = true // start watching POLLOUT
			}
			return
		}
		if err != nil {
			p.peerDown(pc, fmt.Errorf("%w: send: %v", ErrSocket, err))
			return
		}
		pc.pending[0] = nil
		pc.pending = pc.pending[1:]
		sent++
	}
	pc.pending = nil
	if !pc.stalledSince.IsZero() {
		pc.stalledSince = time.Time{}
		p.pollerStale = true
	}
}

// peer returns the open DEALER to peerID, opening one if needed; on failure
// it reports the peer down and returns nil.
func (p *pump) peer(peerID string, ep endpoint) *peerConn {
	if pc := p.peers[peerID]; pc != nil {
		return pc
	}
	p.monitorN++
	monitorAddr := fmt.Sprintf("inproc://peerkv-zmqctl-monitor-%d", p.monitorN)
	pc, err := openPeer(p.ctx, p.t.localID, peerID, ep, monitorAddr, p.t.opts)
	if err != nil {
		p.reportDown(peerID, fmt.Errorf("%w: %v", ErrSocket, err))
		return nil
	}
	p.peers[peerID] = pc
	p.byMonitor[pc.monitor] = pc
	p.pollerStale = true
	p.t.counters.openPeers.Add(1)
	p.t.log.Debug("dialing peer", "peer", peerID, "addr", ep.addr)
	return pc
}

// expireDeadlines reports peers whose handshake or stalled send queue
// outlived its deadline.
func (p *pump) expireDeadlines(now time.Time) {
	o := p.t.opts
	for _, pc := range p.peers {
		switch {
		case !pc.deadline.IsZero() && now.After(pc.deadline):
			p.peerDown(pc, fmt.Errorf("%w: no ZMTP handshake within %v", ErrConnectTimeout, o.ConnectTimeout))
		case !pc.stalledSince.IsZero() && now.Sub(pc.stalledSince) > o.SendTimeout:
			p.peerDown(pc, fmt.Errorf("%w: %d frames waited %v for room", ErrSendQueueFull, len(pc.pending), o.SendTimeout))
		}
	}
}

func (p *pump) peerDown(pc *peerConn, err error) {
	p.forget(pc, 0)
	p.reportDown(pc.id, err)
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
	p.t.released(pc.id, len(pc.pending))
	pc.pending = nil
	delete(p.peers, pc.id)
	delete(p.byMonitor, pc.monitor)
	delete(p.byDealer, pc.dealer)
	pc.close(linger)
	p.pollerStale = true
	p.t.counters.openPeers.Add(-1)
}

// emit queues an event behind any backlog, so events stay in order.
func (p *pump) emit(ev control.Event) {
	if len(p.backlog) == 0 {
		select {
		case p.t.events <- ev:
			return
		default:
		}
	}
	p.backlog = append(p.backlog, ev)
}

func (p *pump) flushBacklog() {
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

// shutdown closes every socket and terminates the context. It must not
// panic out of the pump's deferred cleanup.
func (p *pump) shutdown() {
	defer func() {
		if r := recover(); r != nil {
			p.t.log.Error("control transport shutdown panicked", "panic", r)
		}
	}()
	p.t.stopAccepting()
	p.closeSockets()
	if err := p.ctx.Term(); err != nil {
		p.t.log.Warn("zmq context term failed", "err", err)
	}
	p.t.log.Info("control transport closed")
}

func (p *pump) closeSockets() {
	for _, pc := range p.peers {
		p.forget(pc, 0) // as vLLM: closing does not wait for peers
	}
	if p.t.wake != nil {
		p.t.wake.close()
	}
	for _, s := range []*zmq.Socket{p.wakeRecv, p.router} {
		if s != nil {
			s.Close()
		}
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
}

// recvRouterMessage reads one whole message. Parts past the second are
// read and dropped, so a message of many parts costs no Go memory. The
// identity part carries no metadata when zmq_poll prefetched the message,
// so the address is asked of every part until one has it.
func recvRouterMessage(sock *zmq.Socket) (msg routerMessage, err error) {
	want := []string{peerAddressProperty}
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

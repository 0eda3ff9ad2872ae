package zmqctl

import (
	"fmt"
	"net/netip"
	"strconv"
	"time"

	zmq "github.com/pebbe/zmq4"
	"golang.org/x/sys/unix"
)

// routerEvents are what the ROUTER's monitor reports: each accepted and
// each ended connection with its file descriptor, and failed handshakes
// (to name an encrypt mismatch; the descriptor comes with the disconnect
// that follows).
const routerEvents = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | handshakeFailures

const handshakeFailures = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL |
	zmq.EVENT_HANDSHAKE_FAILED_AUTH

// fdProperty is the message property libzmq fills with the descriptor of
// the TCP connection a message came in on (the one ZMQ_SRCFD reads).
const fdProperty = "__fd"

// inboundConn is one TCP connection our ROUTER accepted.
type inboundConn struct {
	fd int // libzmq's descriptor: what its events and messages name
	// dup is our own descriptor of the same socket (F_DUPFD_CLOEXEC, taken
	// as it was accepted), closed when libzmq reports it ended: shutdown(2)
	// on it always reaches this connection, even when libzmq has closed fd
	// and the process reused the number since.
	dup      int
	remote   netip.AddrPort
	network  netip.Prefix
	accepted time.Time
	heard    bool // libzmq gave us a frame from it: the ROUTER reads it
	shut     bool // we shut it down; its disconnect is on the way
	yielded  bool // shut as silent for a new connection from its address (restart.go)
}

// inbound counts the ROUTER's connections, per host, per network and in
// all, from its monitor, and ends those it must not keep (see pump.shut):
// over Options.MaxInboundConnsPerHost or MaxInboundConnsPerNetwork, or
// unheard, that is never read by libzmq (a second connection under a
// routing id in use, or one that sent nothing) past Options.UnheardTimeout.
// Past Options.MaxInboundConns the oldest connection of the most crowded
// network makes room for a newcomer from a less crowded one. Each holds up
// to Options.RecvHWM+1 frames in libzmq, so these bound what strangers
// park there. Owned by the pump.
type inbound struct {
	monitor   *zmq.Socket
	monitorFd int
	localPort uint16

	conns map[int]*inboundConn
	// live, perHost and perNet count the connections not shut (one shut
	// is on its way out and makes room at once).
	live    int
	perHost map[netip.Addr]int
	perNet  map[netip.Prefix]int
	unheard map[int]*inboundConn // not heard and not shut
	// drainedAt is when the ROUTER last had nothing for us to read: a
	// connection accepted UnheardTimeout before that, and still unheard,
	// is not being read.
	drainedAt time.Time
	// handshakeFailed: the next disconnect ends a connection whose ZMTP
	// handshake failed, logged with its address (events of one socket
	// come in order from its I/O thread).
	handshakeFailed zmq.Event
	logs            rateLimiter
	// nextSilentCheck paces yieldSilent; yieldedEnded is when a connection
	// from each address that yielded last ended (restart.go).
	nextSilentCheck time.Time
	yieldedEnded    map[netip.Addr]time.Time
}

func newInbound() *inbound {
	return &inbound{monitorFd: -1, conns: map[int]*inboundConn{}, perHost: map[netip.Addr]int{},
		perNet: map[netip.Prefix]int{}, unheard: map[int]*inboundConn{}, logs: rateLimiter{every: 10 * time.Second}}
}

// uncount takes c out of the live counts (it was shut, or it ended).
func (in *inbound) uncount(c *inboundConn) {
	in.live--
	if in.perHost[c.remote.Addr()]--; in.perHost[c.remote.Addr()] <= 0 {
		delete(in.perHost, c.remote.Addr())
	}
	if in.perNet[c.network]--; in.perNet[c.network] <= 0 {
		delete(in.perNet, c.network)
	}
}

// forget drops c, ended, and closes our descriptor of it.
func (in *inbound) forget(c *inboundConn) {
	delete(in.conns, c.fd)
	delete(in.unheard, c.fd)
	if !c.shut {
		in.uncount(c)
	}
	_ = unix.Close(c.dup)
}

// forgetAll closes our descriptors once the monitor has stopped: no
// disconnect will come for them.
func (in *inbound) forgetAll() {
	for _, c := range in.conns {
		in.forget(c)
	}
}

// networkOf groups source addresses as the tier does for sessions: IPv4
// by /24, IPv6 by /64, so one host's many addresses count together.
func networkOf(a netip.Addr) netip.Prefix {
	a = a.Unmap().WithZone("")
	bits := 64
	if a.Is4() {
		bits = 24
	}
	p, _ := a.Prefix(bits)
	return p
}

// monitorRouter attaches the ROUTER's monitor and its reader. It runs
// before Bind: libzmq's I/O thread sends monitor events with a blocking
// send, so the reader must be there before the first event.
func (p *pump) monitorRouter() error {
	addr := nextMonitorAddr()
	if err := p.router.Monitor(addr, routerEvents); err != nil {
		return fmt.Errorf("monitor router: %w", err)
	}
	reader, err := newSocket(p.ctx, zmq.PAIR)
	if err != nil {
		return err
	}
	p.in.monitor = reader
	// No bound on the events waiting for the pump: libzmq's I/O thread
	// sends them with a blocking send, so a full queue (a connection flood
	// while the pump is busy) would stall every connection of that thread,
	// and stopping the monitor at Close, which waits for that send, would
	// never return. An event is a few dozen bytes; the pump drains them
	// every pass.
	if err := reader.SetRcvhwm(0); err != nil {
		return fmt.Errorf("router monitor receive hwm: %w", err)
	}
	if err := reader.Connect(addr); err != nil {
		return fmt.Errorf("connect router monitor %s: %w", addr, err)
	}
	return nil
}

// watchRouterMonitor polls the monitor's reader (after Bind, once the
// epoll set exists).
func (p *pump) watchRouterMonitor() error {
	fd, err := p.in.monitor.GetFd()
	if err != nil {
		return fmt.Errorf("router monitor fd: %w", err)
	}
	if err := p.watch(fd, fdTarget{kind: fdRouterMonitor}, unix.EPOLLIN); err != nil {
		return err
	}
	p.in.monitorFd = fd
	p.readRouterMonitor()
	return nil
}

// stopRouterMonitor ends the monitor before its reader, as for a DEALER
// (peerConn.stopWatching).
func (p *pump) stopRouterMonitor() {
	if p.router != nil {
		_ = p.router.Monitor("", 0)
	}
	p.unwatch(p.in.monitorFd)
	p.in.monitorFd = -1
	p.in.forgetAll()
	if p.in.monitor != nil {
		p.in.monitor.Close()
		p.in.monitor = nil
	}
}

func (p *pump) readRouterMonitor() {
	for p.in.monitor != nil {
		event, _, value, err := p.in.monitor.RecvEvent(zmq.DONTWAIT)
		if err != nil {
			if !isAgain(err) {
				p.t.log.Warn("router monitor receive failed", "err", err)
			}
			return
		}
		switch {
		case event&zmq.EVENT_ACCEPTED != 0:
			p.accepted(value, time.Now())
		case event&zmq.EVENT_DISCONNECTED != 0:
			p.inboundGone(value)
		case event&handshakeFailures != 0:
			p.in.handshakeFailed = event
		}
	}
}

// accepted records a new connection and ends it at once when it comes
// from an address the node does not admit, or one too many from its host
// or network. Past MaxInboundConns it makes room (see makeRoom).
func (p *pump) accepted(fd int, now time.Time) {
	in, o := p.in, p.t.opts
	if old := in.conns[fd]; old != nil {
		in.forget(old) // its disconnect was never reported; the number is another socket's now
	}
	remote, ok := peerOf(fd)
	if !ok || localPortOf(fd) != in.localPort {
		return // gone already (its disconnect follows), or the number is no longer our connection's
	}
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		// No descriptor to keep watch with (out of descriptors): end it
		// now, while fd was just checked to be this connection.
		_ = unix.Shutdown(fd, unix.SHUT_RDWR)
		p.t.counters.inboundShut.Add(1)
		if n, ok := in.logs.allow("shut", now); ok {
			p.t.log.Warn("closing an inbound control connection", "from", remote.String(),
				"why", "no descriptor left to watch it with: "+err.Error(), "suppressed", n)
		}
		return
	}
	c := &inboundConn{fd: fd, dup: dup, remote: remote, network: networkOf(remote.Addr()), accepted: now}
	in.conns[fd] = c
	in.unheard[fd] = c
	in.live++
	in.perHost[remote.Addr()]++
	in.perNet[c.network]++
	p.t.counters.inboundConns.Store(int64(len(in.conns)))
	switch {
	case o.AdmitAddr != nil && !o.AdmitAddr(remote.Addr()):
		p.t.counters.notAdmitted.Add(1)
		p.shut(c, fmt.Sprintf("%s is not an address this node admits (allowed_peers)", remote.Addr()))
	case in.perHost[remote.Addr()] > o.MaxInboundConnsPerHost:
		p.shut(c, fmt.Sprintf("%d control connections from %s, bound %d", in.perHost[remote.Addr()], remote.Addr(), o.MaxInboundConnsPerHost))
	case in.perNet[c.network] > o.MaxInboundConnsPerNetwork:
		p.shut(c, fmt.Sprintf("%d control connections from %s, bound %d", in.perNet[c.network], c.network, o.MaxInboundConnsPerNetwork))
	case in.live > o.MaxInboundConns:
		p.makeRoom(c)
	}
}

// makeRoom keeps MaxInboundConns when newcomer is one too many: it shuts
// the oldest connection of the most crowded network, so connections that
// stay open cannot lock newcomers out, unless newcomer's own network holds
// as many (then newcomer goes, and two networks never trade a slot back
// and forth).
func (p *pump) makeRoom(newcomer *inboundConn) {
	in := p.in
	crowded, most := newcomer.network, in.perNet[newcomer.network]
	for n, k := range in.perNet {
		if k > most {
			crowded, most = n, k
		}
	}
	why := fmt.Sprintf("%d control connections open, bound %d (max_inbound_conns), %d of them from %s",
		in.live, p.t.opts.MaxInboundConns, most, crowded)
	if crowded == newcomer.network {
		p.shut(newcomer, why)
		return
	}
	var oldest *inboundConn
	for _, c := range in.conns {
		if !c.shut && c.network == crowded && (oldest == nil || c.accepted.Before(oldest.accepted)) {
			oldest = c
		}
	}
	p.shut(oldest, why+"; making room for a newcomer from "+newcomer.network.String())
}

func (p *pump) inboundGone(fd int) {
	in := p.in
	c := in.conns[fd]
	if in.handshakeFailed != 0 {
		from := "an address gone before it was seen" // closed before the pump read its accept
		if c != nil {
			from = c.remote.String()
		}
		p.logHandshakeFailure(from, in.handshakeFailed)
		in.handshakeFailed = 0
	}
	if c == nil {
		return
	}
	in.forget(c)
	if c.yielded {
		p.yieldedGone(c, time.Now()) // restart.go
	}
	p.t.counters.inboundConns.Store(int64(len(in.conns)))
}

// heard marks the connection a frame came in on as read by libzmq.
func (p *pump) heard(fd int) {
	if _, known := p.in.conns[fd]; !known && fd >= 0 {
		// Its accept may still wait in the monitor: read it first, or the
		// connection would count as unheard for good (and an idle peer's
		// connection be shut as one libzmq never reads).
		p.readRouterMonitor()
	}
	if c := p.in.unheard[fd]; c != nil {
		c.heard = true
		delete(p.in.unheard, fd)
	}
}

// expireUnheard ends connections libzmq has not read from within
// UnheardTimeout although the ROUTER had nothing else for us: a second
// connection under an identity in use (libzmq never reads it without
// handover), or one that never sent a frame. Either would hold what it
// sent in libzmq for as long as it stays open. A ROUTER kept busy never
// drains, so past unheardHardFactor x UnheardTimeout one goes regardless.
func (p *pump) expireUnheard(now time.Time) {
	drained := p.in.drainedAt
	if !p.routerMore && len(p.backlog) == 0 {
		drained = now // nothing is waiting to be read right now
	}
	timeout := p.t.opts.UnheardTimeout
	for _, c := range p.in.unheard {
		if !c.accepted.Add(timeout).After(drained) || !c.accepted.Add(unheardHardFactor*timeout).After(now) {
			p.shut(c, fmt.Sprintf("no frame read from it within %v (a second connection under an identity in use, or a silent one)",
				timeout))
		}
	}
}

// unheardHardFactor: an unheard connection is shut this many
// UnheardTimeouts after it was accepted even if the ROUTER never drained.
const unheardHardFactor = 4

// unheardTimeout is how long until the next unheard connection is due.
func (p *pump) unheardTimeout(now time.Time, timeout time.Duration) time.Duration {
	for _, c := range p.in.unheard {
		due := c.accepted.Add(p.t.opts.UnheardTimeout)
		if !due.After(now) {
			due = c.accepted.Add(unheardHardFactor * p.t.opts.UnheardTimeout)
		}
		timeout = min(timeout, due.Sub(now))
	}
	return timeout
}

// shut ends an inbound connection with shutdown(2) on our descriptor of
// it; libzmq then sees the connection end, closes it and reports it gone.
func (p *pump) shut(c *inboundConn, why string) {
	delete(p.in.unheard, c.fd)
	if c.shut {
		return
	}
	c.shut = true
	p.in.uncount(c)
	if err := unix.Shutdown(c.dup, unix.SHUT_RDWR); err != nil {
		return
	}
	p.t.counters.inboundShut.Add(1)
	if n, ok := p.in.logs.allow("shut", time.Now()); ok {
		p.t.log.Warn("closing an inbound control connection", "from", c.remote.String(), "why", why, "suppressed", n)
	}
}

// logHandshakeFailure names the likely cause of a failed ZMTP handshake on
// an inbound connection: the two ends disagree on encrypt.
func (p *pump) logHandshakeFailure(from string, event zmq.Event) {
	n, ok := p.in.logs.allow("handshake", time.Now())
	if !ok {
		return
	}
	p.t.log.Warn("inbound control handshake failed", "from", from, "event", event.String(),
		"cause", encryptMismatch(p.t.opts.Curve != nil, "the dialer"), "suppressed", n)
}

// encryptMismatch says, in an operator's words, why a ZMTP handshake
// failed between this node and peer: libzmq reports only that it did.
func encryptMismatch(curve bool, peer string) string {
	if curve {
		return "CURVE/encrypt mismatch: this node has encrypt on (CURVE) and " + peer +
			" does not (a stock vLLM peer, or encrypt off), or derives its keys from another auth secret: " +
			"set encrypt and the same secret on every peer"
	}
	return "CURVE/encrypt mismatch: this node has encrypt off (plaintext) and " + peer +
		" requires CURVE (encrypt on), or it is not a ZMQ peer: set encrypt the same on every peer"
}

// peerOf returns the remote address of a TCP socket descriptor.
func peerOf(fd int) (netip.AddrPort, bool) {
	sa, err := unix.Getpeername(fd)
	if err != nil {
		return netip.AddrPort{}, false
	}
	return addrPortOf(sa)
}

func localPortOf(fd int) uint16 {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return 0
	}
	ap, _ := addrPortOf(sa)
	return ap.Port()
}

func addrPortOf(sa unix.Sockaddr) (netip.AddrPort, bool) {
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port)), true
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr).Unmap(), uint16(a.Port)), true
	}
	return netip.AddrPort{}, false
}

// messageFd is the descriptor libzmq reported for a message, -1 if none.
func messageFd(meta map[string]string) int {
	s, ok := meta[fdProperty]
	if !ok {
		return -1
	}
	fd, err := strconv.Atoi(s)
	if err != nil {
		return -1
	}
	return fd
}

// rateLimiter lets one log line per cause through every period, counting
// what it held back.
type rateLimiter struct {
	every time.Duration
	last  map[string]time.Time
	held  map[string]int
}

func (r *rateLimiter) allow(cause string, now time.Time) (suppressed int, ok bool) {
	if r.last == nil {
		r.last, r.held = map[string]time.Time{}, map[string]int{}
	}
	if last, seen := r.last[cause]; seen && now.Sub(last) < r.every {
		r.held[cause]++
		return 0, false
	}
	suppressed = r.held[cause]
	r.last[cause], r.held[cause] = now, 0
	return suppressed, true
}

package zmqctl

import (
	"fmt"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// fatalEvents are the monitor events vLLM's zmq.py treats as the end of a
// connection. EVENT_CLOSED also fires when a connect attempt is refused.
const fatalEvents = zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED |
	zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL |
	zmq.EVENT_HANDSHAKE_FAILED_AUTH

// monitoredEvents adds the handshake success that ends the connect deadline.
const monitoredEvents = fatalEvents | zmq.EVENT_HANDSHAKE_SUCCEEDED

// peerConn is the DEALER to one remote peer and the PAIR reading its monitor.
type peerConn struct {
	id       string
	dealer   *zmq.Socket
	monitor  *zmq.Socket
	deadline time.Time // for the handshake; zero once up

	// The pump's epoll registrations; -1 when not watched.
	monitorFd, dealerFd int

	// pending holds frames libzmq refused (queue full), oldest first; they
	// go out when the DEALER polls writable. stalledSince bounds the wait.
	pending      [][]byte
	stalledSince time.Time

	// parkedUntil is set when the owner disconnected the peer: the DEALER
	// stays open until then (Options.DisconnectLinger) so a goodbye still
	// goes out, and a Send or Connect meanwhile takes it back instead of
	// dialing a second connection under our identity, which a ROUTER
	// without handover (vLLM's) would never read. Nothing about a parked
	// peer is reported.
	parkedUntil time.Time

	// dialAt holds back the DEALER's connect until then: we closed our last
	// connection to the peer a moment ago, and the peer's ROUTER must see it
	// end before one under the same identity arrives (see pump.closed).
	dialAt time.Time
	ep     endpoint
}

func (pc *peerConn) parked() bool { return !pc.parkedUntil.IsZero() }

// heartbeat applies the ZMTP heartbeat settings to a socket (all of ours).
func heartbeat(sock *zmq.Socket, o Options) error {
	if err := sock.SetHeartbeatIvl(o.HeartbeatInterval); err != nil {
		return fmt.Errorf("set heartbeat interval: %w", err)
	}
	if err := sock.SetHeartbeatTimeout(o.HeartbeatTimeout); err != nil {
		return fmt.Errorf("set heartbeat timeout: %w", err)
	}
	if o.HeartbeatTTL == 0 {
		return nil
	}
	if err := sock.SetHeartbeatTtl(o.HeartbeatTTL); err != nil {
		return fmt.Errorf("set heartbeat ttl: %w", err)
	}
	return nil
}

// openPeer creates the monitored DEALER and starts connecting. The monitor
// is attached before connect so no event is missed; monitorAddr must be
// unique in the context (nextMonitorAddr) because libzmq frees inproc
// names asynchronously.
func openPeer(ctx *zmq.Context, affinity uint64, localID, peerID string, ep endpoint, monitorAddr string, o Options) (pc *peerConn, err error) {
	return openPeerAt(ctx, affinity, localID, peerID, ep, monitorAddr, o, time.Time{})
}

// openPeerAt is openPeer with the connect held back until dialAt (zero:
// now); the pump dials it then (peerConn.dial).
func openPeerAt(ctx *zmq.Context, affinity uint64, localID, peerID string, ep endpoint, monitorAddr string, o Options,
	dialAt time.Time) (pc *peerConn, err error) {
	start := time.Now()
	if dialAt.After(start) {
		start = dialAt
	}
	pc = &peerConn{id: peerID, deadline: start.Add(o.ConnectTimeout), monitorFd: -1, dealerFd: -1, dialAt: dialAt, ep: ep}
	defer func() {
		if err != nil {
			pc.close(0)
			pc = nil
		}
	}()
	if pc.dealer, err = newSocket(ctx, zmq.DEALER); err != nil {
		return pc, err
	}
	settings := []struct {
		what string
		err  func() error
	}{
		{"affinity", func() error { return pc.dealer.SetAffinity(affinity) }},
		{"identity", func() error { return pc.dealer.SetIdentity(localID) }},
		{"send hwm", func() error { return pc.dealer.SetSndhwm(o.SocketSendHWM) }},
		{"max message size", func() error { return pc.dealer.SetMaxmsgsize(maxMsgSize(o)) }},
		// Nothing reads a DEALER: peers never send on it, so a peer that
		// does gets TCP back-pressure instead of our memory.
		{"receive hwm", func() error { return pc.dealer.SetRcvhwm(1) }},
		{"curve", func() error { return secureDealer(pc.dealer, o) }},
		{"ipv6", func() error { return pc.dealer.SetIpv6(ep.ipv6) }},
		{"heartbeat", func() error { return heartbeat(pc.dealer, o) }},
		{"monitor", func() error { return pc.dealer.Monitor(monitorAddr, monitoredEvents) }},
	}
	for _, s := range settings {
		if err := s.err(); err != nil {
			return pc, fmt.Errorf("dealer %s: %w", s.what, err)
		}
	}
	if pc.monitor, err = newSocket(ctx, zmq.PAIR); err != nil {
		return pc, err
	}
	if err = pc.monitor.Connect(monitorAddr); err != nil {
		return pc, fmt.Errorf("connect monitor %s: %w", monitorAddr, err)
	}
	if dialAt.IsZero() {
		err = pc.dial()
	}
	return pc, err
}

// dial connects the DEALER.
func (pc *peerConn) dial() error {
	pc.dialAt = time.Time{}
	if err := pc.dealer.Connect(pc.ep.addr); err != nil {
		return fmt.Errorf("connect %s: %w", pc.ep.addr, err)
	}
	return nil
}

// close releases the DEALER, keeping it up to linger to flush frames
// already queued (a goodbye); zero drops them.
func (pc *peerConn) close(linger time.Duration) {
	pc.stopWatching()
	if pc.dealer != nil {
		_ = pc.dealer.SetLinger(linger)
		pc.dealer.Close()
	}
}

// stopWatching ends the monitor before its reader goes away. libzmq's I/O
// thread sends monitor events with a blocking send, so an event raised
// after the reading PAIR is closed (the remote dropping the connection
// while we tear down) would block that thread forever and stall every other
// socket of the context, which every Transport of the process shares: no
// later connection would finish its handshake. The monitor is stopped even
// when its reader was never opened; stopping none is a no-op.
func (pc *peerConn) stopWatching() {
	if pc.dealer != nil {
		_ = pc.dealer.Monitor("", 0)
	}
	if pc.monitor != nil {
		pc.monitor.Close()
		pc.monitor = nil
	}
}

package zmqctl

import (
	"fmt"
	"log/slog"
	"net/netip"
	"time"
)

// Defaults match vLLM's zmq.py where vLLM has a value, except the heartbeat.
//
// vLLM pings every 2 s with a 10 s TTL. libzmq cancels a connection's
// heartbeat timers (after each ping, and after each TTL-carrying ping it
// receives) by walking every timer of its I/O thread, so that cost grows
// with the square of the connections an I/O thread carries: in the 64-peer
// scale bench (8 peers a process) it was most of the idle mesh's CPU. We
// ping every 5 s and send no TTL: each end's own pings (ROUTER and DEALER
// alike) reap a dead or hung link within interval + timeout (15 s), and a
// TTL cannot reap one on its own anyway (libzmq re-arms it only on the next
// PING). vLLM peers still ping us at their rate and get their PONGs.
const (
	DefaultHeartbeatInterval = 5 * time.Second
	DefaultHeartbeatTimeout  = 10 * time.Second
	DefaultConnectTimeout    = 10 * time.Second
	DefaultSendTimeout       = 10 * time.Second
	DefaultSendHWM           = 1000
	// DefaultSocketSendHWM is lower than vLLM's 1000 (a local setting,
	// invisible on the wire): libzmq counts frames, not bytes, and an
	// answer is as large as the lookup it answers.
	DefaultSocketSendHWM = 16
	// DefaultSendQueueBytes and DefaultTotalSendQueueBytes bound what
	// waits in front of libzmq, per peer and for all peers.
	DefaultSendQueueBytes      = 32 << 20
	DefaultTotalSendQueueBytes = 256 << 20
	// DefaultRecvHWM: frames one inbound connection may queue in libzmq
	// (its default is 1000); past it TCP pushes back on the sender.
	DefaultRecvHWM = 1
	// DefaultMaxInboundConns, DefaultMaxInboundConnsPerHost and
	// DefaultMaxInboundConnsPerNetwork bound the ROUTER's TCP connections,
	// as the TCP data path bounds its own.
	DefaultMaxInboundConns           = 1024
	DefaultMaxInboundConnsPerHost    = 64
	DefaultMaxInboundConnsPerNetwork = 256
	// DefaultUnheardTimeout: an inbound connection libzmq has read no frame
	// from by then is closed (every peer sends as soon as it connects).
	DefaultUnheardTimeout   = 5 * time.Second
	DefaultEventBuffer      = 1024
	DefaultCloseTimeout     = 5 * time.Second
	DefaultDisconnectLinger = 500 * time.Millisecond
	// DefaultMaxFrameBytes is the protocol's own default; a node passes the
	// bound it derived from its region.
	DefaultMaxFrameBytes = 64 << 20
)

// Options tunes a Transport. Zero fields take the defaults above.
type Options struct {
	HeartbeatInterval time.Duration // ZMQ_HEARTBEAT_IVL
	HeartbeatTimeout  time.Duration // ZMQ_HEARTBEAT_TIMEOUT
	// HeartbeatTTL, when positive, is sent in our PINGs (ZMQ_HEARTBEAT_TTL);
	// zero sends none (the default; see above).
	HeartbeatTTL time.Duration
	// ConnectTimeout bounds the time from opening a DEALER to its completed
	// ZMTP handshake; past it the peer is reported down.
	ConnectTimeout time.Duration
	// SendTimeout bounds how long frames may wait for room in a peer's
	// libzmq queue; past it the peer has stopped reading and is reported
	// down.
	SendTimeout time.Duration
	// SendHWM bounds the frames waiting per peer in front of libzmq (Send
	// fails with ErrSendQueueFull beyond that).
	SendHWM int
	// SocketSendHWM bounds the frames libzmq holds per peer (ZMQ_SNDHWM;
	// at most SendHWM).
	SocketSendHWM int
	// SendQueueBytes bounds the bytes waiting for one peer in front of
	// libzmq, TotalSendQueueBytes those of all peers; a frame past the
	// first, or past the second for a peer over its share of it (twice it
	// for any peer), is refused with ErrSendQueueFull, and a peer libzmq
	// already refuses (it stopped reading) is reported down and its queue
	// freed.
	SendQueueBytes      int
	TotalSendQueueBytes int
	// RecvHWM bounds the frames one inbound connection may queue in libzmq
	// (ZMQ_RCVHWM on the ROUTER); with the frame being decoded, one holds
	// at most (RecvHWM+1) x MaxFrameBytes.
	RecvHWM int
	// MaxInboundConnsPerHost and MaxInboundConnsPerNetwork bound the
	// ROUTER's TCP connections per remote address and per network (IPv4
	// /24, IPv6 /64): one over is shut down. Past MaxInboundConns the
	// oldest connection of the most crowded network is shut down to make
	// room, unless the newcomer's network is that one (then it goes).
	MaxInboundConns           int
	MaxInboundConnsPerHost    int
	MaxInboundConnsPerNetwork int
	// UnheardTimeout: an inbound connection libzmq has read no frame from
	// by then (a second connection under an identity in use is never read
	// in plaintext) is shut down, with what it queued.
	UnheardTimeout time.Duration
	// AdmitAddr, when set, says whether a connection from this source
	// address (the kernel's) may stay: one it refuses is shut down as it is
	// accepted, so it queues nothing in libzmq (the node passes its
	// allowed_peers).
	AdmitAddr func(netip.Addr) bool
	// DisconnectLinger bounds how long a DEALER the owner disconnected
	// stays open flushing frames already queued (the goodbye to a peer we
	// reject goes out on a connection that may not be up yet), and may be
	// taken back by a Send or Connect. vLLM's DEALERs linger 500 ms.
	DisconnectLinger time.Duration
	// MaxFrameBytes bounds one inbound frame (ZMQ_MAXMSGSIZE on every
	// socket): libzmq drops the connection of a peer that announces a larger
	// frame before allocating it.
	MaxFrameBytes int
	// Curve, when set, runs every connection under ZMQ CURVE with these
	// keys (see DeriveCurveKeys); nil is plaintext, as stock vLLM peers need.
	Curve *CurveKeys
	// EventBuffer is the capacity of the Events channel.
	EventBuffer int
	// CloseTimeout bounds how long Close waits for the pump to exit (plus
	// the lingering DEALERs the last Transport of a process waits for; see
	// Transport.Close).
	CloseTimeout time.Duration
	Logger       *slog.Logger

	// pumpHook, when set (tests only), runs at the top of every pump
	// iteration; it lets a test inject a panic into the pump.
	pumpHook func()
}

func (o Options) withDefaults() (Options, error) {
	durations := []struct {
		name  string
		value *time.Duration
		def   time.Duration
	}{
		{"HeartbeatInterval", &o.HeartbeatInterval, DefaultHeartbeatInterval},
		{"HeartbeatTimeout", &o.HeartbeatTimeout, DefaultHeartbeatTimeout},
		{"HeartbeatTTL", &o.HeartbeatTTL, 0},
		{"ConnectTimeout", &o.ConnectTimeout, DefaultConnectTimeout},
		{"SendTimeout", &o.SendTimeout, DefaultSendTimeout},
		{"CloseTimeout", &o.CloseTimeout, DefaultCloseTimeout},
		{"DisconnectLinger", &o.DisconnectLinger, DefaultDisconnectLinger},
		{"UnheardTimeout", &o.UnheardTimeout, DefaultUnheardTimeout},
	}
	for _, d := range durations {
		switch {
		case *d.value < 0:
			return o, fmt.Errorf("zmqctl: Options.%s is negative (%v)", d.name, *d.value)
		case *d.value == 0:
			*d.value = d.def
		}
	}
	counts := []struct {
		name  string
		value *int
		def   int
	}{
		{"SendHWM", &o.SendHWM, DefaultSendHWM},
		{"SocketSendHWM", &o.SocketSendHWM, DefaultSocketSendHWM},
		{"EventBuffer", &o.EventBuffer, DefaultEventBuffer},
		{"MaxFrameBytes", &o.MaxFrameBytes, DefaultMaxFrameBytes},
		{"SendQueueBytes", &o.SendQueueBytes, DefaultSendQueueBytes},
		{"TotalSendQueueBytes", &o.TotalSendQueueBytes, DefaultTotalSendQueueBytes},
		{"RecvHWM", &o.RecvHWM, DefaultRecvHWM},
		{"MaxInboundConns", &o.MaxInboundConns, DefaultMaxInboundConns},
		{"MaxInboundConnsPerHost", &o.MaxInboundConnsPerHost, DefaultMaxInboundConnsPerHost},
		{"MaxInboundConnsPerNetwork", &o.MaxInboundConnsPerNetwork, DefaultMaxInboundConnsPerNetwork},
	}
	for _, c := range counts {
		switch {
		case *c.value < 0:
			return o, fmt.Errorf("zmqctl: Options.%s must not be negative (%d)", c.name, *c.value)
		case *c.value == 0:
			*c.value = c.def
		}
	}
	o.SocketSendHWM = min(o.SocketSendHWM, o.SendHWM)
	if o.Curve != nil {
		if err := o.Curve.validate(); err != nil {
			return o, err
		}
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return o, nil
}

// Package zmqctl is the ZMQ control transport, wire-compatible with vLLM's
// P2P tier (vllm/v1/kv_offload/tiering/p2p/control/zmq.py).
//
// # Sockets
//
// One ROUTER is bound at tcp://bindHost:port and is used only for receiving.
// Every outbound path goes through one DEALER per remote peer whose ZMQ
// identity is the local id, "host:port", exactly the string peers dial. A
// link A<->B is therefore two TCP connections, A.DEALER->B.ROUTER and
// B.DEALER->A.ROUTER. The ROUTER delivers [identity, payload]; any other
// frame count is dropped and counted in Stats.DroppedInbound.
//
// All sockets belong to one pump goroutine (libzmq sockets are not thread
// safe). Public methods append commands to a queue and wake the pump
// through an eventfd; the pump waits on an epoll set of the sockets'
// ZMQ_FD descriptors when idle, registered once per socket, so a message
// costs the same with 1 or 64 peers. One exception: a Send with nothing
// queued ahead of it, to a peer whose DEALER is open and not stalled, is
// handed to that DEALER by the caller under the transport's mutex (the
// pump uses DEALERs only under it and never while it waits; the mutex is
// the memory barrier libzmq requires of a socket changing threads).
//
// The pump parks in Go's network poller on its epoll set rather than
// blocking a thread in epoll_wait, which would hold a P and leave
// goroutines readied meanwhile (by the pump or a host call) waiting for
// sysmon to take it back.
//
// # Identity rules
//
// A ROUTER routes by identity. libzmq's ROUTER without ROUTER_HANDOVER
// (vLLM's, and ours in plaintext) reads a new connection's routing id,
// finds it taken by an older connection, and never reads the new
// connection again: every frame on it is lost, even after the old one has
// gone. Hence:
//
//   - Toward any ROUTER we do not open a second connection under our
//     identity while the first is ours to reuse: a DEALER the owner
//     disconnected stays open for DisconnectLinger, and a Send or Connect
//     meanwhile takes it back (see Teardown). A new DEALER to a peer whose
//     last one closed less than 100 ms ago (its linger over, or the peer
//     found dead) holds its connect until then, so that on a working
//     network the remote ROUTER sees the old connection end first (a FIN
//     lost or delayed longer can still cost the new one, until that
//     connection fails); frames sent meanwhile wait in front of it.
//   - In plaintext our ROUTER keeps handover off: with it, anyone who can
//     reach the port could dial under an established peer's id and leave
//     that peer's connection unread (libzmq stops reading it; it closes
//     only when the heartbeat times out, ~15 s), again and again. Without
//     it, such a dialer is the one left unread; what it can still do is
//     dial first, before the peer's own connection exists (docs/security.md,
//     D6). A connection left unread is shut down (see Limits).
//   - Under CURVE only members can dial, and our ROUTER sets handover: a
//     member that restarted before we saw its old link close is heard on
//     its new connection at once.
//
// A peer that died without closing its socket is reaped by the ZMTP
// heartbeat (interval 5 s, timeout 10 s, no TTL, on the ROUTER and every
// DEALER; Options says why not vLLM's 2 s and TTL). In plaintext a
// restarted peer whose new connection arrived before that would be unheard
// on it, so a silent connection yields to a new one from its own address
// (restart.go): a live peer answers our PINGs and is never silent that
// long, so no dialer takes a live peer's place. Redial drops a DEALER for
// good (a handshake that timed out on it, a peer that restarted), where
// Disconnect lets the next Send take it back. The sender's identity must
// equal the string the receiver dialed, or the receiver sees its replies as
// a new peer.
//
// # Peer loss
//
// Each DEALER is watched through a socket monitor. The events vLLM treats as
// fatal (disconnected, closed, handshake failed) end the peer; so does a
// DEALER whose ZMTP handshake has not completed within Options.ConnectTimeout
// (vLLM waits forever there), and a DEALER whose queue stays full for
// Options.SendTimeout (the peer stopped reading). The DEALER is then closed and forgotten, and one
// EventPeerDown is reported; a later Send or Connect opens a fresh DEALER.
// Loss is reported only for peers this transport has a DEALER to (after
// Connect or Send): a peer that only sends to us is not watched.
//
// # Teardown
//
// Disconnect parks the DEALER: it stays open, unreported, for
// Options.DisconnectLinger, so a goodbye queued on a connection that is not
// up yet still goes out (a rejected peer must hear why), then it is closed
// with linger 0. A Send or Connect to the peer meanwhile takes the same
// DEALER back. Peers found dead are closed with linger 0; Close gives a
// parked DEALER the rest of its linger.
// Each DEALER's monitor is stopped before its reader or the DEALER closes:
// libzmq's I/O thread sends monitor events with a blocking send, and one
// raised with no reader left would stall every socket of the context,
// which all Transports of the process share (below). Close returns with
// the ROUTER's port free: it unbinds and waits for libzmq to report the
// listener closed, so a peer restarted in the same process can bind it
// again (Term did that when each Transport had its own context).
//
// # Context
//
// All Transports of a process share one ZMQ context (context.go), so a
// process runs four libzmq I/O threads and one reaper thread, not a pair per
// peer (the scale bench has 8 peers per process). Each Transport's network
// sockets stay on one of those threads (ZMQ_AFFINITY), as they did with a
// context of its own, so libzmq handles its connections in order. New
// acquires it, and creates it if no Transport holds one; the last Transport to close
// terminates it, so a process that closed all its Transports runs no
// libzmq thread, and a later New starts a fresh context. What one
// Transport does must therefore never block the context: the monitor
// order above, linger 0 on every socket (libzmq's own monitor sockets
// too: ZMQ_BLOCKY off), monitor endpoints numbered process-wide (inproc
// names live in the context). A DEALER closed by Disconnect keeps
// lingering in the context after its Transport has closed; the last
// Transport's Close waits for it, at most its DisconnectLinger. A forked
// child cannot use its parent's context (libzmq's threads are not there):
// New fails in it.
//
// # Back-pressure
//
// Frames are never dropped for a slow consumer: when the Events channel is
// full the pump stops reading the ROUTER (libzmq and TCP then push back on
// the senders) while it keeps sending, connecting and watching peers.
//
// A consumer may instead take events on the pump's goroutine (Hand, the
// tier does): each frame then reaches it with no goroutine hand-off, which
// on a loaded host is a thread wake-up (10-20 µs a frame on a 2-core VM).
// The pump calls it without its lock, so it may Send; while it runs the
// pump reads nothing else, and libzmq and TCP push back as above.
//
// Send never blocks. Frames that libzmq's queue (ZMQ_SNDHWM,
// Options.SocketSendHWM frames: libzmq counts frames, not bytes, so it is
// kept small) refuses wait in order in front of it and go out when the
// DEALER becomes writable; libzmq learns late what its I/O thread
// consumed, so a full queue alone is not a dead peer (vLLM fails the
// connection at once). A peer whose frames keep waiting in front of libzmq
// for Options.SendTimeout (the clock starts at the first frame libzmq
// refuses, and stops only when nothing waits) is reported down
// (ErrSendQueueFull) and its queues are freed. Send fails with
// ErrSendQueueFull, the frame dropped, once Options.SendHWM frames or
// Options.SendQueueBytes bytes for the peer are waiting in front of
// libzmq, or Options.TotalSendQueueBytes for all peers and the peer holds
// more than its share of that (the total over the peers with frames
// waiting): peers that stopped reading cannot starve one that reads, and
// are reported down as above. Twice TotalSendQueueBytes is the hard
// bound for all peers.
//
// # Limits
//
// Every socket has ZMQ_MAXMSGSIZE = Options.MaxFrameBytes (plus CURVE's 33
// bytes per frame in CURVE mode): libzmq reads a frame's length from its
// header and drops the connection of a peer that announces more, before
// allocating anything, and the frame is never delivered. Parts of a
// message past the second are read and discarded. The bound is per frame:
// libzmq holds the parts of a message until its last arrives, with no bound
// on their number, so a stranger can grow us with a message it never
// finishes. CURVE (below) is the defence: without the secret no frame gets
// past the handshake.
//
// The ROUTER queues at most Options.RecvHWM frames per connection
// (ZMQ_RCVHWM; libzmq's default is 1000), so with the frame being read a
// connection holds at most (RecvHWM+1) x MaxFrameBytes in libzmq. Its
// monitor reports each accepted and each ended connection with its file
// descriptor, and every frame carries the descriptor it came in on
// (libzmq's "__fd" property, what ZMQ_SRCFD reads), so the pump counts
// connections per remote address, per network (IPv4 /24, IPv6 /64, as
// the tier groups sessions) and in all, and knows which ones libzmq reads.
// It keeps its own descriptor of each connection (dup'd as it is
// accepted, once it has checked the descriptor is a connection to our
// port; closed when libzmq reports the connection ended, and at Close),
// so shutdown(2) on it always reaches that connection, never a descriptor
// libzmq closed and the process reused. It shuts down one over
// Options.MaxInboundConnsPerHost or MaxInboundConnsPerNetwork, and one
// libzmq has read no frame from within Options.UnheardTimeout although
// the ROUTER had nothing else to give (or within four times that, however
// busy the ROUTER): a second connection under a routing id in use (libzmq
// never reads it without handover) or a silent one. Past
// Options.MaxInboundConns it shuts the oldest connection of the most
// crowded network to make room, or the newcomer when its own network is
// that one: connections that stay open (heartbeats keep any that spoke
// once) cannot lock out newcomers from elsewhere. libzmq 4.3
// never frees what it queued from a connection it did not identify
// (router.cpp keeps the pipe among its anonymous ones, waiting for a read
// that never comes), so that much, at most RecvHWM+1 frames, outlives it.
// A failed handshake on the ROUTER is logged with the dialer's address and
// its likely cause, an encrypt mismatch; on a DEALER the same words are in
// the EventPeerDown error. DEALERs have a receive
// queue of one message: peers never send on them, and one that does is
// held back by TCP instead of filling our memory. Event.Addr is the IP of
// the frame's TCP connection (libzmq's "Peer-Address", from the kernel),
// unlike PeerID, which the sender chooses.
//
// # Encryption
//
// With Options.Curve (keys from DeriveCurveKeys, one shared secret per
// cluster) every connection runs ZMQ CURVE: the ROUTER is a CURVE server,
// every DEALER a client of the cluster's server key. This gives the
// control frames (identities included) confidentiality and integrity
// against anyone on the network, and only holders of the secret can
// complete a handshake: a server must hold the server secret key, a client
// the server's public key, which is derived from the secret as well and
// never sent on the wire (no ZAP handler checks client keys). It does
// not cover the data path (NIXL's one-sided writes travel outside ZMQ),
// and it does not authenticate which peer id a node is: every node holds
// the same keys, so the tier's HMAC challenge-response proves that. CURVE
// peers and plaintext peers (stock vLLM) cannot talk to each other: the
// handshake fails, frames are not delivered, and the dialing side reports
// EventPeerDown as for an unreachable peer, within Options.ConnectTimeout.
//
// # Latency
//
// A Send to a connected peer wakes no pump; a queued command costs one
// eventfd write, coalesced across concurrent callers. tests/bench/zmqfloor
// compares a round trip A→B→A with raw pebbe sockets and pyzmq in one run
// (2-core loopback VM: ~1.1–1.9× the raw Go floor). Idle transports are
// parked in Go's poller and use no CPU.
package zmqctl

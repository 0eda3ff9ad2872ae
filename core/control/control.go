// Package control defines the control path: one bound listener and one
// outbound connection per remote peer, carrying msgpack frames.
//
// Contract for every implementation:
//   - Send never blocks: it queues the frame and returns. Frames to one peer
//     are delivered in order, one frame per message.
//   - Send to a peer with no connection opens one (dialing the peer id
//     "host:port"), so a producer can answer a consumer it has never dialed.
//   - Events delivers, in order, every inbound frame with the sender's peer
//     id and source address, and a PeerDown event when a peer's connection
//     is lost. The channel is closed after Close.
//   - Close is idempotent, drops queued frames (linger 0) and returns only
//     after the transport's goroutines have exited.
package control

import (
	"errors"
	"time"
)

// EventKind distinguishes inbound frames from connection state changes.
type EventKind int

const (
	// EventFrame carries one inbound message frame.
	EventFrame EventKind = iota + 1
	// EventPeerDown reports that the connection to PeerID was lost.
	EventPeerDown
)

// Event is what a transport reports upward.
type Event struct {
	Kind   EventKind
	PeerID string
	// Addr (EventFrame only) is the IP address, without port, that the
	// frame's connection comes from, as the kernel knows it; "" if the
	// transport cannot tell. PeerID is only what the sender claims to be;
	// Addr it cannot choose, so per-source limits key on Addr.
	Addr  string
	Frame []byte // EventFrame only; owned by the receiver
	Err   error  // EventPeerDown only: why the peer is considered gone
}

// Transport is the control path of one peer.
type Transport interface {
	// LocalID is this node's identity, "host:port", exactly as peers dial it.
	LocalID() string
	// Connect opens the connection to peerID ahead of the first Send.
	Connect(peerID string) error
	// Send queues one frame for peerID.
	Send(peerID string, frame []byte) error
	// Disconnect ends our use of the connection to peerID. Frames already
	// sent get a short, bounded chance to go out (a goodbye must reach a
	// peer we reject); no EventPeerDown follows. A Send or Connect soon
	// after may reuse the connection, and is reported as usual from then.
	Disconnect(peerID string)
	// Events is the inbound stream; see the package contract.
	Events() <-chan Event
	// Close stops the transport.
	Close() error
}

// Redialer is a Transport that can drop its connection to a peer at once
// so that the next Send or Connect dials a fresh one, instead of taking
// back the one Disconnect leaves lingering: for a connection that got no
// answer (a handshake that timed out on it) or leads to a peer's previous
// incarnation (the peer restarted). Frames not yet sent on it are dropped;
// no EventPeerDown follows.
type Redialer interface {
	Redial(peerID string)
}

// Handing is a Transport that can call a function for each event on its
// own goroutine instead of sending it to Events: a frame then reaches its
// consumer with no goroutine hand-off, which on a loaded host is a thread
// wake-up per frame.
type Handing interface {
	// Hand makes the transport call h for every event, in order, from now
	// on; events already waiting in Events are handed to h first. It
	// returns once the switch is made. Call it before reading Events,
	// which from then on only closes (after Close, as before). h runs on the transport's goroutine: it may call Send,
	// Connect and Disconnect, and must not wait for anything that waits for
	// the transport (Close).
	Hand(h func(Event))
}

// ErrClosed is returned by calls on a closed transport.
var ErrClosed = errors.New("control transport closed")

// ErrBadPeerID is returned for a peer id that is not "host:port".
var ErrBadPeerID = errors.New("peer id must be host:port")

// Causes of a connection to a peer that never came up (ConnectError), as
// metric label values.
const (
	CauseRefused         = "refused"          // nothing listens at the address
	CauseUnreachable     = "unreachable"      // no route to the peer's network or host
	CauseUnresolvable    = "unresolvable"     // the peer id's host name does not resolve
	CauseTimeout         = "timeout"          // no handshake in time: packets dropped, or a silent listener
	CauseEncryptMismatch = "encrypt_mismatch" // the transport handshake failed: one end encrypts, the other does not
	CauseClosed          = "closed"           // the peer closed the connection before the handshake finished
)

// ConnectFailureCauses lists every cause, in documentation order.
var ConnectFailureCauses = []string{
	CauseRefused, CauseUnreachable, CauseUnresolvable, CauseTimeout, CauseEncryptMismatch, CauseClosed,
}

// ConnectError is the Err of an EventPeerDown for a connection that never
// completed its handshake. Unsure means Cause is the transport's best
// guess (it saw only that the attempt failed, or ran out of time), which a
// Diagnoser can name more precisely.
type ConnectError struct {
	Cause  string
	Unsure bool
	Err    error
}

func (e *ConnectError) Error() string { return e.Err.Error() }
func (e *ConnectError) Unwrap() error { return e.Err }

// Diagnoser is a Transport that can find out why a peer cannot be reached.
type Diagnoser interface {
	// Diagnose tries to reach peerID once, within timeout, and returns why
	// no connection can be made (one of ConnectFailureCauses) with the
	// details in words, or "" when one can be made now. It blocks: call it
	// off every lock.
	Diagnose(peerID string, timeout time.Duration) (cause, detail string)
}

package zmqctl

import "errors"

// Reasons carried in EventPeerDown.Err (wrapped with detail) and returned by Send.
var (
	// ErrConnectTimeout: the ZMTP handshake with the peer did not complete
	// within Options.ConnectTimeout (nothing listening, or not a ZMQ peer).
	ErrConnectTimeout = errors.New("peer did not complete the connection in time")
	// ErrPeerDisconnected: the socket monitor reported a fatal event
	// (disconnected, closed, handshake failed, heartbeat expired).
	ErrPeerDisconnected = errors.New("peer connection lost")
	// ErrSendQueueFull: too many frames are queued for the peer; it has
	// stopped reading.
	ErrSendQueueFull = errors.New("send queue to peer is full")
	// ErrSocket: libzmq refused an operation on the peer's socket.
	ErrSocket = errors.New("zmq socket error")
)

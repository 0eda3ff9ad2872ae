// Package memctl is an in-memory control.Transport for unit tests of the
// session and tier layers: a Hub routes frames between the Transports it
// made, in order, with no sockets.
//
// It mirrors zmqctl's observable behaviour: Send never blocks; a peer that
// is killed or closed is reported with EventPeerDown to every transport
// that holds a connection to it (made by Connect or Send), at once; Send or
// Connect to a peer that does not exist reports EventPeerDown to the
// sender, like a refused connection; after PeerDown the connection is
// forgotten and a later Send dials again. A peer that only receives from
// another is not told when that one dies (zmqctl watches DEALERs only).
// A frame's Event.Addr is the host part of the sender's id.
package memctl

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"

	"github.com/peerkv/peerkv/core/control"
)

// ErrPeerGone is the EventPeerDown reason: the peer was killed, closed, or
// never existed.
var ErrPeerGone = errors.New("memctl: peer is gone")

// Hub connects in-memory transports by their ids.
type Hub struct {
	mu    sync.Mutex
	peers map[string]*Transport
	drops map[link]bool
}

type link struct{ from, to string }

// NewHub returns an empty hub.
func NewHub() *Hub {
	return &Hub{peers: map[string]*Transport{}, drops: map[link]bool{}}
}

// Transport returns a new transport with identity localID. If a live
// transport already has that id it is killed first, as a restarted process
// would replace it.
func (h *Hub) Transport(localID string) *Transport {
	t, old := h.replace(localID)
	if old != nil {
		old.shutdown()
	}
	return t
}

// replace puts a new transport under localID and returns the one it
// replaced, if any.
func (h *Hub) replace(localID string) (t, old *Transport) {
	t = newTransport(h, localID)
	h.mu.Lock()
	defer h.mu.Unlock()
	old = h.peers[localID]
	h.peers[localID] = t
	return t, old
}

// RestartSilently starts a new transport under localID in place of the
// live one, as a process restarted after a crash whose end no peer saw
// (power lost, a partition): the old transport stops (its Events close) but
// nobody is told, and frames to localID reach the new one from now on.
func (h *Hub) RestartSilently(localID string) *Transport {
	t, old := h.replace(localID)
	if old != nil {
		old.stop()
	}
	return t
}

// Kill makes peerID vanish like a crashed process: its transport stops
// (Events closed) and every transport connected to it gets EventPeerDown.
func (h *Hub) Kill(peerID string) {
	h.mu.Lock()
	t := h.peers[peerID]
	h.mu.Unlock()
	if t != nil {
		t.shutdown()
	}
}

// SetDrop makes frames from→to vanish silently (a stalled link) while drop
// is true. Neither side is told.
func (h *Hub) SetDrop(from, to string, drop bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if drop {
		h.drops[link{from, to}] = true
	} else {
		delete(h.drops, link{from, to})
	}
}

// route delivers one frame, or reports why it cannot.
func (h *Hub) route(from, to string, frame []byte) (delivered bool, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	dst := h.peers[to]
	if dst == nil {
		return false, fmt.Errorf("%w: %s", ErrPeerGone, to)
	}
	if h.drops[link{from, to}] {
		return false, nil
	}
	// Appending under h.mu keeps frames from concurrent senders in the
	// order their Send calls were routed.
	return dst.inbox.Push(control.Event{Kind: control.EventFrame, PeerID: from, Addr: hostOf(from), Frame: frame}), nil
}

// InjectFrom delivers frame to peer to as if fromID sent it over a
// connection from addr: what an impostor claiming fromID's identity from
// another host looks like. It reports whether to exists.
func (h *Hub) InjectFrom(to, fromID, addr string, frame []byte) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	dst := h.peers[to]
	if dst == nil {
		return false
	}
	return dst.inbox.Push(control.Event{Kind: control.EventFrame, PeerID: fromID, Addr: addr, Frame: bytes.Clone(frame)})
}

// hostOf stands in for the source address zmqctl reads from the kernel:
// the host part of the sender's id, so ids sharing a host share an Addr.
func hostOf(peerID string) string {
	host, _, err := net.SplitHostPort(peerID)
	if err != nil {
		return ""
	}
	return host
}

func (h *Hub) exists(peerID string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.peers[peerID] != nil
}

// leave removes t and tells every transport connected to it.
func (h *Hub) leave(t *Transport) {
	h.mu.Lock()
	if h.peers[t.localID] == t {
		delete(h.peers, t.localID)
	}
	others := make([]*Transport, 0, len(h.peers))
	for _, o := range h.peers {
		others = append(others, o)
	}
	h.mu.Unlock()
	for _, o := range others {
		o.peerGone(t.localID)
	}
}

func validPeerID(peerID string) error {
	host, port, err := net.SplitHostPort(peerID)
	if err != nil || host == "" {
		return fmt.Errorf("%w: %q", control.ErrBadPeerID, peerID)
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("%w: %q", control.ErrBadPeerID, peerID)
	}
	return nil
}

package tier_test

import (
	"sync"

	"github.com/peerkv/peerkv/core/control"
)

// ctlHub is an in-memory control path for these tests: ordered delivery,
// and Kill to make a peer vanish.
type ctlHub struct {
	mu    sync.Mutex
	peers map[string]*ctlPeer
}

type ctlPeer struct {
	hub    *ctlHub
	id     string
	events chan control.Event
	dead   bool
	once   sync.Once
}

func newCtlHub() *ctlHub { return &ctlHub{peers: map[string]*ctlPeer{}} }

func (h *ctlHub) Transport(id string) control.Transport {
	p := &ctlPeer{hub: h, id: id, events: make(chan control.Event, 4096)}
	h.mu.Lock()
	h.peers[id] = p
	h.mu.Unlock()
	return p
}

// Kill makes id vanish: it stops receiving, and its peers see it go down.
func (h *ctlHub) Kill(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if p := h.peers[id]; p != nil {
		p.dead = true
	}
	for _, other := range h.peers {
		if other.id != id && !other.dead {
			other.events <- control.Event{Kind: control.EventPeerDown, PeerID: id, Err: control.ErrClosed}
		}
	}
}

func (p *ctlPeer) LocalID() string              { return p.id }
func (p *ctlPeer) Connect(string) error         { return nil }
func (p *ctlPeer) Disconnect(string)            {}
func (p *ctlPeer) Events() <-chan control.Event { return p.events }

func (p *ctlPeer) Send(to string, frame []byte) error {
	p.hub.mu.Lock()
	defer p.hub.mu.Unlock()
	if p.dead {
		return control.ErrClosed
	}
	dst := p.hub.peers[to]
	if dst == nil || dst.dead {
		return nil // like ZMQ: queued for a peer that never reads
	}
	dst.events <- control.Event{Kind: control.EventFrame, PeerID: p.id, Frame: append([]byte(nil), frame...)}
	return nil
}

func (p *ctlPeer) Close() error {
	p.hub.mu.Lock()
	defer p.hub.mu.Unlock()
	p.dead = true
	p.once.Do(func() { close(p.events) })
	return nil
}

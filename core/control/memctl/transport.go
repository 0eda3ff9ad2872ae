package memctl

import (
	"bytes"
	"fmt"
	"sync"

	"github.com/peerkv/peerkv/core/control"
	"github.com/peerkv/peerkv/core/control/eventq"
)

// Transport is one peer on a Hub; it implements control.Transport.
type Transport struct {
	hub     *Hub
	localID string
	inbox   *eventq.Queue
	events  chan control.Event
	done    chan struct{} // closed when the delivery goroutine exits

	// hand, set once by Hand before handed closes, takes the events
	// instead of the channel.
	hand     func(control.Event)
	handed   chan struct{}
	adopted  chan struct{} // closed once deliver took Hand's marker
	handOnce sync.Once

	mu        sync.Mutex
	closed    bool
	connected map[string]bool // peers we hold a connection to
}

var (
	_ control.Transport = (*Transport)(nil)
	_ control.Handing   = (*Transport)(nil)
)

func newTransport(h *Hub, localID string) *Transport {
	t := &Transport{
		hub:       h,
		localID:   localID,
		inbox:     eventq.New(),
		events:    make(chan control.Event),
		done:      make(chan struct{}),
		handed:    make(chan struct{}),
		adopted:   make(chan struct{}),
		connected: map[string]bool{},
	}
	go t.deliver()
	return t
}

// LocalID returns the transport's identity.
func (t *Transport) LocalID() string { return t.localID }

// Events returns the inbound stream; it is closed after Close or Kill.
func (t *Transport) Events() <-chan control.Event { return t.events }

// Hand makes the delivery goroutine call h for every event instead of
// sending it to Events; see control.Handing. It returns once delivery has
// passed a marker it queues (or stopped), so every event delivered after
// it is handed; only the first call counts.
func (t *Transport) Hand(h func(control.Event)) {
	t.handOnce.Do(func() {
		t.hand = h
		close(t.handed)
		if !t.inbox.Push(control.Event{}) { // the marker: Kind 0
			return
		}
		select {
		case <-t.adopted:
		case <-t.done:
		}
	})
}

// Connect records a connection to peerID; a missing peer is reported with
// EventPeerDown, as a control.ConnectError (refused, as on a network).
func (t *Transport) Connect(peerID string) error {
	if err := t.open(peerID); err != nil {
		return err
	}
	if !t.hub.exists(peerID) {
		t.peerDown(peerID, &control.ConnectError{Cause: control.CauseRefused, Err: fmt.Errorf("%w: %s", ErrPeerGone, peerID)})
	}
	return nil
}

// Send delivers a copy of frame to peerID's Events, in order.
func (t *Transport) Send(peerID string, frame []byte) error {
	if err := t.open(peerID); err != nil {
		return err
	}
	if _, err := t.hub.route(t.localID, peerID, bytes.Clone(frame)); err != nil {
		t.peerGone(peerID)
	}
	return nil
}

// Disconnect forgets the connection to peerID without an event.
func (t *Transport) Disconnect(peerID string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.connected, peerID)
}

// Close stops the transport; peers connected to it see EventPeerDown.
func (t *Transport) Close() error {
	t.shutdown()
	return nil
}

func (t *Transport) open(peerID string) error {
	if err := validPeerID(peerID); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return control.ErrClosed
	}
	t.connected[peerID] = true
	return nil
}

// peerGone reports peerID down once per connection and forgets it.
func (t *Transport) peerGone(peerID string) {
	t.peerDown(peerID, fmt.Errorf("%w: %s", ErrPeerGone, peerID))
}

// peerDown reports peerID down for err once per connection and forgets it.
func (t *Transport) peerDown(peerID string, err error) {
	t.mu.Lock()
	wasConnected := t.connected[peerID] && !t.closed
	delete(t.connected, peerID)
	t.mu.Unlock()
	if wasConnected {
		t.inbox.Push(control.Event{Kind: control.EventPeerDown, PeerID: peerID, Err: err})
	}
}

func (t *Transport) shutdown() {
	if t.stop() {
		t.hub.leave(t)
	}
}

// stop closes t, telling no one; it reports whether t was open.
func (t *Transport) stop() bool {
	t.mu.Lock()
	already := t.closed
	t.closed = true
	t.mu.Unlock()
	if !already {
		t.inbox.Close()
	}
	<-t.done
	return !already
}

// deliver moves inbox events to the Events channel, blocking on a slow
// consumer until Close.
func (t *Transport) deliver() {
	defer close(t.done)
	defer close(t.events)
	for {
		ev, ok := t.inbox.Pop()
		if !ok {
			return
		}
		if ev.Kind == 0 { // Hand's marker
			close(t.adopted)
			continue
		}
		select {
		case <-t.handed: // once handed, never the channel: the two would race
			t.hand(ev)
			continue
		default:
		}
		select {
		case <-t.handed:
			t.hand(ev)
		case t.events <- ev:
		case <-t.inbox.Closed():
			return
		}
	}
}

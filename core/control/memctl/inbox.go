package memctl

import (
	"sync"

	"github.com/peerkv/peerkv/core/control"
)

// inbox is an unbounded FIFO, so Send never blocks on a slow receiver.
type inbox struct {
	mu     sync.Mutex
	queue  []control.Event
	ready  chan struct{} // capacity 1: "queue may be non-empty"
	closed chan struct{}
	done   bool
}

func newInbox() *inbox {
	return &inbox{ready: make(chan struct{}, 1), closed: make(chan struct{})}
}

// push appends ev; it reports false once the inbox is closed.
func (b *inbox) push(ev control.Event) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return false
	}
	b.queue = append(b.queue, ev)
	select {
	case b.ready <- struct{}{}:
	default:
	}
	return true
}

// pop waits for the oldest event; false means the inbox was closed.
func (b *inbox) pop() (control.Event, bool) {
	for {
		b.mu.Lock()
		if b.done {
			b.mu.Unlock()
			return control.Event{}, false
		}
		if len(b.queue) > 0 {
			ev := b.queue[0]
			b.queue[0] = control.Event{}
			b.queue = b.queue[1:]
			b.mu.Unlock()
			return ev, true
		}
		b.mu.Unlock()
		select {
		case <-b.ready:
		case <-b.closed:
		}
	}
}

func (b *inbox) close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.done {
		b.done = true
		b.queue = nil
		close(b.closed)
	}
}

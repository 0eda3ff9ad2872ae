package faults

import (
	"sync"

	"github.com/peerkv/peerkv/core/control"
)

// queue is an unbounded FIFO of inbound events, so a held or delayed frame
// never blocks the goroutine reading the wrapped transport.
type queue struct {
	mu    sync.Mutex
	items []control.Event
	ready chan struct{} // capacity 1: "items may be non-empty"
	done  chan struct{}
	ended bool
}

func newQueue() *queue {
	return &queue{ready: make(chan struct{}, 1), done: make(chan struct{})}
}

// push appends ev unless the queue was closed.
func (q *queue) push(ev control.Event) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.ended {
		return
	}
	q.items = append(q.items, ev)
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

// pop waits for the oldest event; false once closed (the rest is dropped,
// as a closed transport drops what it queued).
func (q *queue) pop() (control.Event, bool) {
	for {
		q.mu.Lock()
		if q.ended {
			q.mu.Unlock()
			return control.Event{}, false
		}
		if len(q.items) > 0 {
			ev := q.items[0]
			q.items[0] = control.Event{}
			q.items = q.items[1:]
			q.mu.Unlock()
			return ev, true
		}
		q.mu.Unlock()
		select {
		case <-q.ready:
		case <-q.done:
		}
	}
}

func (q *queue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.ended {
		q.ended = true
		q.items = nil
		close(q.done)
	}
}

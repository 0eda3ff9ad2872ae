// Package eventq is an unbounded FIFO of control events between a goroutine
// that must never block (a transport's reader, a test's frame mangler) and
// one that consumes at its own pace. It is for in-process transports and
// test rigs: the frames it holds were already bounded by whoever made them.
package eventq

import (
	"sync"

	"github.com/peerkv/peerkv/core/control"
)

// Queue is safe for one or more pushers and one popper.
type Queue struct {
	mu     sync.Mutex
	items  []control.Event
	ready  chan struct{} // capacity 1: "items may be non-empty"
	closed chan struct{}
	ended  bool
}

// New returns an open, empty queue.
func New() *Queue {
	return &Queue{ready: make(chan struct{}, 1), closed: make(chan struct{})}
}

// Push appends ev; it reports false once the queue is closed.
func (q *Queue) Push(ev control.Event) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.ended {
		return false
	}
	q.items = append(q.items, ev)
	select {
	case q.ready <- struct{}{}:
	default:
	}
	return true
}

// Pop waits for the oldest event; false once the queue is closed (what it
// still held is dropped, as a closed transport drops what it queued).
func (q *Queue) Pop() (control.Event, bool) {
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
		case <-q.closed:
		}
	}
}

// Closed is closed once Close ran.
func (q *Queue) Closed() <-chan struct{} { return q.closed }

// Close drops what is queued and ends every Pop; later Pushes are refused.
func (q *Queue) Close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.ended {
		q.ended = true
		q.items = nil
		close(q.closed)
	}
}

package nixl

import (
	"sync"
	"time"

	"github.com/peerkv/peerkv/core/data"
)

// completionQueue decouples the owner goroutine from the reader: pushes never
// block, and a forwarder delivers in order on out. After close the forwarder
// delivers what is left, waiting at most drainTimeout for a reader, then
// closes out.
type completionQueue struct {
	mu      sync.Mutex
	items   []data.Completion
	closed  bool
	wake    chan struct{} // one pending signal: items were pushed
	closing chan struct{} // closed by close
	out     chan data.Completion
}

func newCompletionQueue(drainTimeout time.Duration) *completionQueue {
	q := &completionQueue{
		wake:    make(chan struct{}, 1),
		closing: make(chan struct{}),
		out:     make(chan data.Completion),
	}
	go q.forward(drainTimeout)
	return q
}

func (q *completionQueue) push(c data.Completion) {
	q.mu.Lock()
	q.items = append(q.items, c)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
}

// close is called once, after the last push.
func (q *completionQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.mu.Unlock()
	close(q.closing)
}

// pop takes the oldest item; finished is true once closed and empty.
func (q *completionQueue) pop() (c data.Completion, ok, finished bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.items) == 0 {
		return c, false, q.closed
	}
	c = q.items[0]
	q.items[0] = data.Completion{}
	q.items = q.items[1:]
	return c, true, false
}

func (q *completionQueue) forward(drainTimeout time.Duration) {
	defer close(q.out)
	closing := q.closing
	var deadline <-chan time.Time // armed when closing fires
	for {
		c, ok, finished := q.pop()
		if finished {
			return
		}
		if !ok {
			select {
			case <-q.wake:
			case <-closing:
				closing, deadline = nil, time.After(drainTimeout)
			}
			continue
		}
		for sent := false; !sent; {
			select {
			case q.out <- c:
				sent = true
			case <-closing:
				closing, deadline = nil, time.After(drainTimeout)
			case <-deadline:
				return // nobody reads after Close; drop the rest
			}
		}
	}
}

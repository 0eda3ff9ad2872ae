package nixl

/*
#include "capi.h"
*/
import "C"

import "sync"

// post is a write waiting for the owner goroutine.
type post struct {
	id       uint64
	peerID   string
	src, dst []C.int
}

// postQueue hands writes to the owner goroutine without waiting for it, and
// keeps the row count of each added peer so Write can check rows at once.
// After close it takes no more: every write it took is posted by the owner
// or handed back by close, to be reported.
type postQueue struct {
	wake chan struct{} // one token: the owner has posts to take

	mu     sync.Mutex
	queued []post
	rows   map[string]uint64 // peers the owner added, by id
	closed bool
}

func newPostQueue() postQueue {
	return postQueue{wake: make(chan struct{}, 1), rows: map[string]uint64{}}
}

// push queues w; false once closed.
func (q *postQueue) push(w post) bool {
	q.mu.Lock()
	if q.closed {
		q.mu.Unlock()
		return false
	}
	q.queued = append(q.queued, w)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return true
}

// take returns the queued writes, in order, and empties the queue.
func (q *postQueue) take() []post {
	q.mu.Lock()
	defer q.mu.Unlock()
	w := q.queued
	q.queued = nil
	return w
}

// close refuses later pushes and returns the writes never taken.
func (q *postQueue) close() []post {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	w := q.queued
	q.queued = nil
	return w
}

// setRows records an added peer's row count; 0 forgets the peer.
func (q *postQueue) setRows(peerID string, n uint64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if n == 0 {
		delete(q.rows, peerID)
	} else {
		q.rows[peerID] = n
	}
}

func (q *postQueue) rowsOf(peerID string) (uint64, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	n, ok := q.rows[peerID]
	return n, ok
}

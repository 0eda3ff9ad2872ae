package nixl

/*
#include "capi.h"
*/
import "C"

import (
	"slices"
	"sync"
	"time"
)

// post is a write waiting for the owner goroutine. It is bound to the
// registration of its peer that Write checked its rows against (gen), never
// to a later one under the same peer id.
type post struct {
	id       uint64
	peerID   string
	gen      uint64
	src, dst []C.int
	queued   time.Time
}

// registration is what Write needs of an added peer.
type registration struct {
	numRows, gen uint64
}

// postQueue hands writes to the owner goroutine without waiting for it, and
// keeps each added peer's registration so Write can check rows at once.
// Every write it takes is posted by the owner, or handed back (by forget,
// when its peer goes, or by close) to be reported failed.
type postQueue struct {
	wake chan struct{} // one token: the owner has posts to take

	mu      sync.Mutex
	queued  []post
	peers   map[string]registration // peers the owner added, by id
	lastGen uint64
	closed  bool
}

func newPostQueue() postQueue {
	return postQueue{wake: make(chan struct{}, 1), peers: map[string]registration{}}
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

// register records an added peer and returns its registration's
// generation.
func (q *postQueue) register(peerID string, numRows uint64) uint64 {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.lastGen++
	q.peers[peerID] = registration{numRows: numRows, gen: q.lastGen}
	return q.lastGen
}

// forget drops a peer's registration and returns its writes not yet taken.
func (q *postQueue) forget(peerID string) []post {
	q.mu.Lock()
	defer q.mu.Unlock()
	delete(q.peers, peerID)
	var gone []post
	kept := q.queued[:0]
	for _, w := range q.queued {
		if w.peerID == peerID {
			gone = append(gone, w)
		} else {
			kept = append(kept, w)
		}
	}
	q.queued = kept
	return gone
}

// cancel takes peerID's write id out of the queue if the owner has not
// taken it yet, and says whether it did.
func (q *postQueue) cancel(peerID string, id uint64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	i := slices.IndexFunc(q.queued, func(w post) bool { return w.id == id && w.peerID == peerID })
	if i >= 0 {
		q.queued = slices.Delete(q.queued, i, i+1)
	}
	return i >= 0
}

func (q *postQueue) registered(peerID string) (registration, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	r, ok := q.peers[peerID]
	return r, ok
}

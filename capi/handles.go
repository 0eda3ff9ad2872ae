package main

import (
	"fmt"
	"sync"

	"github.com/peerkv/peerkv/core/tier"
)

// peer is what a handle refers to.
type peer struct {
	tier *tier.Tier
}

// firstHandle is an unlikely value, so a stray 0, small integer or fd passed
// as a handle is never valid.
const firstHandle int64 = 42<<16 + 1

// handleTable maps integer handles to peers. Handles are never reused, so a
// handle below next that is no longer in the map was released.
type handleTable struct {
	mu    sync.Mutex
	next  int64
	peers map[int64]*peer
	// retiring holds peers whose handle was destroyed while their shutdown
	// runs, so a second destroy of the handle waits for the same teardown.
	retiring map[int64]*peer
}

var handles = handleTable{next: firstHandle, peers: map[int64]*peer{}}

func (t *handleTable) add(p *peer) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.next
	t.next++
	t.peers[h] = p
	return h
}

func (t *handleTable) get(h int64) (*peer, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p, ok := t.peers[h]; ok {
		return p, nil
	}
	return nil, t.unknown(h)
}

// remove deletes h from the table; its peer stays retiring until retired.
// released reports a handle that was valid once and is already gone
// (destroy is idempotent for those); p is then the peer still shutting
// down, if it is.
func (t *handleTable) remove(h int64) (p *peer, released bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p, ok := t.peers[h]; ok {
		delete(t.peers, h)
		if t.retiring == nil {
			t.retiring = map[int64]*peer{}
		}
		t.retiring[h] = p
		return p, false, nil
	}
	if h >= firstHandle && h < t.next {
		return t.retiring[h], true, nil
	}
	return nil, false, t.unknown(h)
}

// shuttingDown returns h's peer, live or still retiring after a destroy,
// so a shutdown racing a destroy waits for the same teardown. A handle
// destroyed and torn down already returns a nil peer and no error: its one
// teardown is done, so shutdown, idempotent like destroy, has nothing left
// to do. A shutdown that loses the race to a whole destroy (it enters after
// the destroy returned) cannot be told from a later one, and handles are
// never reused, so both get that answer; only a handle never created is
// unknown.
func (t *handleTable) shuttingDown(h int64) (*peer, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p, ok := t.peers[h]; ok {
		return p, nil
	}
	if p, ok := t.retiring[h]; ok {
		return p, nil
	}
	if h >= firstHandle && h < t.next {
		return nil, nil
	}
	return nil, t.unknown(h)
}

// retired forgets a destroyed handle's peer once its shutdown returned.
func (t *handleTable) retired(h int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.retiring, h)
}

func (t *handleTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.peers)
}

// unknown describes why h is not valid; t.mu is held.
func (t *handleTable) unknown(h int64) error {
	if h >= firstHandle && h < t.next {
		return fmt.Errorf("handle %d was destroyed: %w", h, errUnknownHandle)
	}
	return fmt.Errorf("handle %d: %w", h, errUnknownHandle)
}

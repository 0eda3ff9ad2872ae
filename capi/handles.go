package main

import (
	"fmt"
	"sync"

	"github.com/peerkv/peerkv/core/tier"
)

// node is what a handle refers to: this process's tier. (A peer is always a
// remote node; see the glossary in core/tier.)
type node struct {
	tier *tier.Tier
}

// firstHandle is an unlikely value, so a stray 0, small integer or fd passed
// as a handle is never valid.
const firstHandle int64 = 42<<16 + 1

// handleTable maps integer handles to nodes. Handles are never reused, so a
// handle below next that is no longer in the map was released.
type handleTable struct {
	mu    sync.Mutex
	next  int64
	nodes map[int64]*node
	// retiring holds nodes whose handle was destroyed while their shutdown
	// runs, so a second destroy of the handle waits for the same teardown.
	retiring map[int64]*node
}

var handles = handleTable{next: firstHandle, nodes: map[int64]*node{}}

func (t *handleTable) add(nd *node) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	h := t.next
	t.next++
	t.nodes[h] = nd
	return h
}

func (t *handleTable) get(h int64) (*node, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if nd, ok := t.nodes[h]; ok {
		return nd, nil
	}
	return nil, t.unknown(h)
}

// remove deletes h from the table; its node stays retiring until retired.
// released reports a handle that was valid once and is already gone
// (destroy is idempotent for those); nd is then the node still shutting
// down, if it is.
func (t *handleTable) remove(h int64) (nd *node, released bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if nd, ok := t.nodes[h]; ok {
		delete(t.nodes, h)
		if t.retiring == nil {
			t.retiring = map[int64]*node{}
		}
		t.retiring[h] = nd
		return nd, false, nil
	}
	if h >= firstHandle && h < t.next {
		return t.retiring[h], true, nil
	}
	return nil, false, t.unknown(h)
}

// shuttingDown returns h's node, live or still retiring after a destroy,
// so a shutdown racing a destroy waits for the same teardown. A handle
// destroyed and torn down already returns a nil node and no error: its one
// teardown is done, so shutdown, idempotent like destroy, has nothing left
// to do. A shutdown that loses the race to a whole destroy (it enters after
// the destroy returned) cannot be told from a later one, and handles are
// never reused, so both get that answer; only a handle never created is
// unknown.
func (t *handleTable) shuttingDown(h int64) (*node, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if nd, ok := t.nodes[h]; ok {
		return nd, nil
	}
	if nd, ok := t.retiring[h]; ok {
		return nd, nil
	}
	if h >= firstHandle && h < t.next {
		return nil, nil
	}
	return nil, t.unknown(h)
}

// retired forgets a destroyed handle's node once its shutdown returned.
func (t *handleTable) retired(h int64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.retiring, h)
}

func (t *handleTable) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.nodes)
}

// unknown describes why h is not valid; t.mu is held.
func (t *handleTable) unknown(h int64) error {
	if h >= firstHandle && h < t.next {
		return fmt.Errorf("handle %d was destroyed: %w", h, errUnknownHandle)
	}
	return fmt.Errorf("handle %d: %w", h, errUnknownHandle)
}

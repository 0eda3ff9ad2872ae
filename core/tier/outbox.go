package tier

import (
	"fmt"

	"github.com/peerkv/peerkv/core/protocol"
	"github.com/peerkv/peerkv/core/session"
)

// The answer to a lookup of many keys (session.DeferredAnswer) is built and
// encoded without the lock host calls wait on, by the outbox goroutine: the
// work grows with the keys (docs/security.md, G16). What a session sends to
// the same peer after it waits behind it in the peer's outbox, so the
// peer's frames keep their order; a goodbye, or the session's end, drops
// what is still waiting (the peer is done with it).

// outbox holds, per peer, the frames waiting behind a deferred answer.
// Owned under t.mu.
type outbox struct {
	queues map[string][]protocol.Message
	peers  []string // peers with a queue, oldest first
	wake   chan struct{}
	done   chan struct{}
}

func newOutbox() outbox {
	return outbox{queues: map[string][]protocol.Message{}, wake: make(chan struct{}, 1), done: make(chan struct{})}
}

// deferSend queues m to peerID when it must wait: it is a deferred answer,
// or frames to the peer wait already. Called with t.mu held.
func (t *Tier) deferSend(peerID string, m protocol.Message) bool {
	q, waiting := t.outbox.queues[peerID]
	if _, heavy := m.(*session.DeferredAnswer); !heavy && !waiting {
		return false
	}
	if !waiting {
		t.outbox.peers = append(t.outbox.peers, peerID)
	}
	t.outbox.queues[peerID] = append(q, m)
	select {
	case t.outbox.wake <- struct{}{}:
	default:
	}
	return true
}

// dropOutbox forgets what waits for peerID. Called with t.mu held.
func (t *Tier) dropOutbox(peerID string) {
	if _, ok := t.outbox.queues[peerID]; !ok {
		return
	}
	delete(t.outbox.queues, peerID)
	for i, p := range t.outbox.peers {
		if p == peerID {
			t.outbox.peers = append(t.outbox.peers[:i], t.outbox.peers[i+1:]...)
			break
		}
	}
}

// runOutbox builds and encodes deferred answers off the lock, then sends
// each with the frames queued behind it, until the tier stops.
func (t *Tier) runOutbox() {
	defer close(t.outbox.done)
	defer t.recoverLoop("the answer outbox")
	for {
		select {
		case <-t.stop:
			return
		case <-t.outbox.wake:
		}
		for t.sendDeferred() {
		}
	}
}

// sendDeferred handles the oldest peer's queue once; false when none waits.
func (t *Tier) sendDeferred() bool {
	t.mu.Lock()
	if len(t.outbox.peers) == 0 || t.closed {
		t.mu.Unlock()
		return false
	}
	peerID := t.outbox.peers[0]
	head := t.outbox.queues[peerID][0]
	t.mu.Unlock()

	var frame []byte
	var err error
	if a, ok := head.(*session.DeferredAnswer); ok {
		frame, err = protocol.Encode(a.Build())
	} else {
		frame, err = protocol.Encode(head)
	}
	t.locked(func() {
		q := t.outbox.queues[peerID]
		if len(q) == 0 || q[0] != head {
			return // dropped meanwhile: the session ended
		}
		t.dropOutbox(peerID)
		if err == nil {
			t.stats.framesOut++
			err = t.ctl.Send(peerID, frame)
		}
		// What followed it goes now, up to the next deferred answer.
		for i, m := range q[1:] {
			if err != nil {
				break
			}
			if _, heavy := m.(*session.DeferredAnswer); heavy {
				t.outbox.peers = append(t.outbox.peers, peerID)
				t.outbox.queues[peerID] = q[1+i:]
				break
			}
			err = t.send(peerID, m)
		}
		if err != nil {
			t.dropOutbox(peerID)
			if s := t.peers.session(peerID); s != nil {
				s.Close(fmt.Sprintf("send of %s failed: %v", head.MsgType(), err), session.Dropped)
			}
		}
	})
	return true
}

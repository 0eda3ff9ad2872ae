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
// The serve desk owns it, under t.mu.
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
// or frames to the peer wait already.
func (o *outbox) deferSend(peerID string, m protocol.Message) bool {
	_, waiting := o.queues[peerID]
	if _, heavy := m.(*session.DeferredAnswer); !heavy && !waiting {
		return false
	}
	o.enqueue(peerID, m)
	return true
}

// enqueue appends ms to peerID's queue and wakes the outbox goroutine.
func (o *outbox) enqueue(peerID string, ms ...protocol.Message) {
	q, waiting := o.queues[peerID]
	if !waiting {
		o.peers = append(o.peers, peerID)
	}
	o.queues[peerID] = append(q, ms...)
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// drop forgets what waits for peerID.
func (o *outbox) drop(peerID string) {
	if _, ok := o.queues[peerID]; !ok {
		return
	}
	delete(o.queues, peerID)
	for i, p := range o.peers {
		if p == peerID {
			o.peers = append(o.peers[:i], o.peers[i+1:]...)
			break
		}
	}
}

// clear forgets every queue (the peer stops).
func (o *outbox) clear() {
	clear(o.queues)
	o.peers = nil
}

// head is the oldest waiting peer and the frame at the head of its queue.
func (o *outbox) head() (string, protocol.Message, bool) {
	if len(o.peers) == 0 {
		return "", nil, false
	}
	peerID := o.peers[0]
	return peerID, o.queues[peerID][0], true
}

// takeFrom removes peerID's queue if head still heads it, returning the
// frames behind head; false if it was dropped meanwhile.
func (o *outbox) takeFrom(peerID string, head protocol.Message) ([]protocol.Message, bool) {
	q := o.queues[peerID]
	if len(q) == 0 || q[0] != head {
		return nil, false
	}
	o.drop(peerID)
	return q[1:], true
}

// runOutbox builds and encodes deferred answers off the lock, then sends
// each with the frames queued behind it, until the tier stops.
func (t *Tier) runOutbox() {
	defer close(t.desk.outbox.done)
	defer t.recoverLoop("the answer outbox")
	for {
		select {
		case <-t.life.stop:
			return
		case <-t.desk.outbox.wake:
		}
		for t.sendDeferred() {
		}
	}
}

// sendDeferred handles the oldest peer's queue once; false when none waits.
func (t *Tier) sendDeferred() bool {
	t.mu.Lock()
	peerID, head, ok := t.desk.outbox.head()
	if !ok || t.life.closed {
		t.unlockHost()
		return false
	}
	t.unlockHost()

	var frame []byte
	var err error
	if a, ok := head.(*session.DeferredAnswer); ok {
		frame, err = protocol.Encode(a.Build())
	} else {
		frame, err = protocol.Encode(head)
	}
	t.locked(func() {
		behind, ok := t.desk.outbox.takeFrom(peerID, head)
		if !ok {
			return // dropped meanwhile: the session ended
		}
		if err == nil {
			t.stats.framesOut++
			err = t.ctl.Send(peerID, frame)
		}
		// What followed it goes now, up to the next deferred answer.
		for i, m := range behind {
			if err != nil {
				break
			}
			if _, heavy := m.(*session.DeferredAnswer); heavy {
				t.desk.outbox.enqueue(peerID, behind[i:]...)
				break
			}
			err = t.send(peerID, m)
		}
		if err != nil {
			t.desk.outbox.drop(peerID)
			if s := t.peers.session(peerID); s != nil {
				s.Close(fmt.Sprintf("send of %s failed: %v", head.MsgType(), err), session.Dropped)
			}
		}
	})
	return true
}

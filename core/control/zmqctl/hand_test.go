package zmqctl

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/control"
)

// handed collects what a Hand function was given.
type handed struct {
	mu     sync.Mutex
	events []control.Event
}

func (h *handed) add(ev control.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, ev)
}

func (h *handed) frames() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	var out []string
	for _, ev := range h.events {
		if ev.Kind == control.EventFrame {
			out = append(out, string(ev.Frame))
		}
	}
	return out
}

// Frames that arrived before Hand go first, then the rest, in order; the
// function may answer with Send from the transport's own goroutine.
func TestHandedFramesKeepTheirOrderAndMayBeAnswered(t *testing.T) {
	a, b := newTestTransport(t, Options{}), newTestTransport(t, Options{})
	for i := range 50 {
		require.NoError(t, a.Send(b.LocalID(), []byte(fmt.Sprint(i))))
	}
	require.Eventually(t, func() bool { return len(b.Events()) > 0 }, 5*time.Second, time.Millisecond, "some wait in Events before Hand")

	var got handed
	b.Hand(func(ev control.Event) {
		got.add(ev)
		if ev.Kind == control.EventFrame {
			require.NoError(t, b.Send(ev.PeerID, ev.Frame)) // answered from the handler
		}
	})
	for i := 50; i < 100; i++ {
		require.NoError(t, a.Send(b.LocalID(), []byte(fmt.Sprint(i))))
	}
	want := make([]string, 100)
	for i := range want {
		want[i] = fmt.Sprint(i)
	}
	require.Eventually(t, func() bool { return len(got.frames()) == 100 }, 5*time.Second, time.Millisecond, "%d: %v", len(got.frames()), got.frames())
	assert.Equal(t, want, got.frames())
	for i := range 100 {
		ev := nextEvent(t, a, 5*time.Second)
		require.Equal(t, want[i], string(ev.Frame), "the answers come back in order")
	}
	assert.Empty(t, b.Events(), "nothing goes to Events once handed")
}

// A peer's loss is handed over like a frame.
func TestAHandedTransportHandsOverPeerDown(t *testing.T) {
	a, b := newTestTransport(t, Options{}), newTestTransport(t, Options{})
	var got handed
	a.Hand(got.add)
	require.NoError(t, a.Send(b.LocalID(), []byte("hi")))
	_ = nextEvent(t, b, 5*time.Second)
	require.NoError(t, b.Close())
	require.Eventually(t, func() bool {
		got.mu.Lock()
		defer got.mu.Unlock()
		for _, ev := range got.events {
			if ev.Kind == control.EventPeerDown && ev.PeerID == b.LocalID() {
				return true
			}
		}
		return false
	}, 10*time.Second, 5*time.Millisecond)
	require.NoError(t, a.Close())
	_, open := <-a.Events()
	assert.False(t, open, "Events still closes when the transport stops")
}

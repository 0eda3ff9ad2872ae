package zmqctl

import (
	"fmt"
	"io"
	"net"
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

// Hand returns only once the pump has switched: a reader of Events started
// right after it (as the tier's loop is) gets nothing, and no frame is
// handled twice or out of order.
func TestNothingReachesEventsAfterHandReturns(t *testing.T) {
	for range 20 {
		a, b := newTestTransport(t, Options{}), newTestTransport(t, Options{})
		for i := range 20 {
			require.NoError(t, a.Send(b.LocalID(), []byte(fmt.Sprint(i))))
		}
		require.Eventually(t, func() bool { return len(b.Events()) > 0 }, 5*time.Second, time.Millisecond)
		var got handed
		b.Hand(got.add)
		stolen := make(chan int)
		go func() {
			n := 0
			for range b.Events() {
				n++
			}
			stolen <- n
		}()
		for i := 20; i < 40; i++ {
			require.NoError(t, a.Send(b.LocalID(), []byte(fmt.Sprint(i))))
		}
		require.Eventually(t, func() bool { return len(got.frames()) == 40 }, 5*time.Second, time.Millisecond, "%v", got.frames())
		for i, f := range got.frames() {
			require.Equal(t, fmt.Sprint(i), f)
		}
		require.NoError(t, b.Close())
		assert.Zero(t, <-stolen)
		require.NoError(t, a.Close())
	}
}

// heldProxy forwards TCP to target once release closes: a peer whose
// handshake finishes only then.
func heldProxy(t *testing.T, target string, release <-chan struct{}) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = l.Close() })
	go func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer in.Close()
				<-release
				out, err := net.Dial("tcp", target)
				if err != nil {
					return
				}
				defer out.Close()
				go func() { _, _ = io.Copy(out, in) }()
				_, _ = io.Copy(in, out)
			}()
		}
	}()
	return l.Addr().String()
}

// A handler that holds the pump past a handshake deadline does not fail a
// handshake that finished meanwhile: the pump looks again before it
// expires deadlines.
func TestAHandlerThatHeldThePumpDoesNotFailAHandshakeThatFinished(t *testing.T) {
	a := newTestTransport(t, Options{ConnectTimeout: 300 * time.Millisecond})
	b, c := newTestTransport(t, Options{}), newTestTransport(t, Options{})
	release := make(chan struct{})
	viaProxy := heldProxy(t, c.LocalID(), release)
	var got handed
	a.Hand(func(ev control.Event) {
		got.add(ev)
		if ev.Kind == control.EventFrame {
			time.Sleep(1500 * time.Millisecond) // longer than staleReady
		}
	})
	require.NoError(t, a.Connect(viaProxy))
	time.Sleep(50 * time.Millisecond) // the pump dialed: the deadline runs
	require.NoError(t, b.Send(a.LocalID(), []byte("hold")))
	time.Sleep(200 * time.Millisecond) // the handler holds the pump
	close(release)                     // the handshake finishes during the hold
	time.Sleep(2 * time.Second)
	got.mu.Lock()
	defer got.mu.Unlock()
	for _, ev := range got.events {
		assert.NotEqual(t, control.EventPeerDown, ev.Kind, "%s: %v", ev.PeerID, ev.Err)
	}
}

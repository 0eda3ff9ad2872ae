package memctl

import (
	"encoding/binary"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/control"
)

func next(t *testing.T, tr control.Transport) control.Event {
	t.Helper()
	select {
	case ev, ok := <-tr.Events():
		require.True(t, ok, "events closed")
		return ev
	case <-time.After(2 * time.Second):
		t.Fatalf("%s: no event", tr.LocalID())
		return control.Event{}
	}
}

func quiet(t *testing.T, tr control.Transport) {
	t.Helper()
	select {
	case ev := <-tr.Events():
		t.Fatalf("%s: unexpected event %+v", tr.LocalID(), ev)
	case <-time.After(50 * time.Millisecond):
	}
}

func TestFramesArriveInOrderWithSenderID(t *testing.T) {
	hub := NewHub()
	a, b := hub.Transport("10.0.0.1:5710"), hub.Transport("10.0.0.2:5710")
	defer a.Close()
	defer b.Close()
	const n = 1000
	for i := range n {
		require.NoError(t, a.Send(b.LocalID(), binary.BigEndian.AppendUint32(nil, uint32(i))))
	}
	for i := range n {
		ev := next(t, b)
		require.Equal(t, control.EventFrame, ev.Kind)
		require.Equal(t, a.LocalID(), ev.PeerID)
		require.Equal(t, uint32(i), binary.BigEndian.Uint32(ev.Frame))
	}
}

func TestFramesCarryTheSendersHostAsAddr(t *testing.T) {
	hub := NewHub()
	dst := hub.Transport("10.0.0.9:5710")
	defer dst.Close()
	for _, id := range []string{"10.0.0.1:5710", "10.0.0.1:5711", "[fd00::1]:5710"} {
		src := hub.Transport(id)
		defer src.Close()
		require.NoError(t, src.Send(dst.LocalID(), []byte("x")))
	}
	for _, want := range []string{"10.0.0.1", "10.0.0.1", "fd00::1"} {
		ev := next(t, dst)
		require.Equal(t, control.EventFrame, ev.Kind)
		assert.Equal(t, want, ev.Addr, "from %s", ev.PeerID)
	}
}

func TestSendCopiesTheFrame(t *testing.T) {
	hub := NewHub()
	a, b := hub.Transport("a:1"), hub.Transport("b:1")
	defer a.Close()
	defer b.Close()
	frame := []byte("original")
	require.NoError(t, a.Send("b:1", frame))
	copy(frame, "CLOBBER!")
	assert.Equal(t, []byte("original"), next(t, b).Frame)
}

func TestKillReportsPeerDownToConnectedPeers(t *testing.T) {
	hub := NewHub()
	a, b, c := hub.Transport("a:1"), hub.Transport("b:1"), hub.Transport("c:1")
	defer a.Close()
	defer c.Close()
	require.NoError(t, a.Connect("b:1"))
	require.NoError(t, c.Send("a:1", []byte("c only talks to a")))
	next(t, a)

	hub.Kill("b:1")
	ev := next(t, a)
	assert.Equal(t, control.EventPeerDown, ev.Kind)
	assert.Equal(t, "b:1", ev.PeerID)
	assert.ErrorIs(t, ev.Err, ErrPeerGone)
	quiet(t, c) // c never connected to b

	_, open := <-b.Events()
	assert.False(t, open, "killed transport's Events must be closed")
	assert.ErrorIs(t, b.Send("a:1", []byte("x")), control.ErrClosed)

	// Sending to the dead peer reports it again, once per attempt.
	require.NoError(t, a.Send("b:1", []byte("anyone?")))
	assert.Equal(t, control.EventPeerDown, next(t, a).Kind)
}

func TestCloseIsSeenLikeKill(t *testing.T) {
	hub := NewHub()
	a, b := hub.Transport("a:1"), hub.Transport("b:1")
	defer a.Close()
	require.NoError(t, a.Send("b:1", []byte("x")))
	require.NoError(t, b.Close())
	require.NoError(t, b.Close(), "idempotent")
	ev := next(t, a)
	assert.Equal(t, control.EventPeerDown, ev.Kind)
	assert.Equal(t, "b:1", ev.PeerID)
}

func TestUnknownPeerIsReportedDown(t *testing.T) {
	hub := NewHub()
	a := hub.Transport("a:1")
	defer a.Close()
	require.NoError(t, a.Connect("nobody:1"))
	ev := next(t, a)
	assert.Equal(t, control.EventPeerDown, ev.Kind)
	assert.Equal(t, "nobody:1", ev.PeerID)
	assert.ErrorIs(t, a.Send("no-port", nil), control.ErrBadPeerID)
}

func TestDisconnectIsSilent(t *testing.T) {
	hub := NewHub()
	a, b := hub.Transport("a:1"), hub.Transport("b:1")
	defer a.Close()
	require.NoError(t, a.Connect("b:1"))
	a.Disconnect("b:1")
	require.NoError(t, b.Close())
	quiet(t, a)
}

func TestSetDropStallsOneDirection(t *testing.T) {
	hub := NewHub()
	a, b := hub.Transport("a:1"), hub.Transport("b:1")
	defer a.Close()
	defer b.Close()
	hub.SetDrop("a:1", "b:1", true)
	require.NoError(t, a.Send("b:1", []byte("lost")))
	quiet(t, b)
	quiet(t, a) // a stalled link is not a dead peer
	require.NoError(t, b.Send("a:1", []byte("other way works")))
	assert.Equal(t, []byte("other way works"), next(t, a).Frame)

	hub.SetDrop("a:1", "b:1", false)
	require.NoError(t, a.Send("b:1", []byte("healed")))
	assert.Equal(t, []byte("healed"), next(t, b).Frame)
}

func TestRestartedPeerReplacesOldOne(t *testing.T) {
	hub := NewHub()
	a := hub.Transport("a:1")
	defer a.Close()
	old := hub.Transport("b:1")
	require.NoError(t, a.Connect("b:1"))
	fresh := hub.Transport("b:1")
	defer fresh.Close()

	assert.Equal(t, control.EventPeerDown, next(t, a).Kind)
	_, open := <-old.Events()
	assert.False(t, open)
	require.NoError(t, a.Send("b:1", []byte("to the new one")))
	assert.Equal(t, []byte("to the new one"), next(t, fresh).Frame)
}

// A restart nobody saw: the old transport stops, no peer is told, and
// frames to the id reach the new one.
func TestSilentRestartTellsNoOne(t *testing.T) {
	hub := NewHub()
	a := hub.Transport("a:1")
	defer a.Close()
	old := hub.Transport("b:1")
	require.NoError(t, a.Connect("b:1"))
	fresh := hub.RestartSilently("b:1")
	defer fresh.Close()

	_, open := <-old.Events()
	assert.False(t, open)
	quiet(t, a)
	require.NoError(t, a.Send("b:1", []byte("to the new one")))
	assert.Equal(t, []byte("to the new one"), next(t, fresh).Frame)
}

func TestConcurrentSendersKeepPerSenderOrder(t *testing.T) {
	hub := NewHub()
	dst := hub.Transport("dst:1")
	const senders, each = 8, 500
	var wg sync.WaitGroup
	for s := range senders {
		src := hub.Transport(fmt.Sprintf("src%d:1", s))
		defer src.Close()
		wg.Go(func() {
			for i := range each {
				assert.NoError(t, src.Send("dst:1", binary.BigEndian.AppendUint32(nil, uint32(i))))
			}
		})
	}
	// Kill and close concurrently with traffic too, for the race detector.
	victim := hub.Transport("victim:1")
	wg.Go(func() {
		for range 100 {
			_ = dst.Send("victim:1", []byte("x"))
		}
	})
	wg.Go(func() { hub.Kill("victim:1") })

	nextIndex := map[string]uint32{}
	for received := 0; received < senders*each; {
		ev := next(t, dst)
		if ev.Kind != control.EventFrame {
			continue
		}
		require.Equal(t, nextIndex[ev.PeerID], binary.BigEndian.Uint32(ev.Frame), "from %s", ev.PeerID)
		nextIndex[ev.PeerID]++
		received++
	}
	wg.Wait()
	require.NoError(t, dst.Close())
	_ = victim.Close()
	for range dst.Events() {
	}
}

// Once handed, every frame goes to the function, in order (those sent
// before Hand first), answers sent from it arrive, and Events only closes.
func TestHandedFramesKeepTheirOrder(t *testing.T) {
	hub := NewHub()
	a, b := hub.Transport("10.0.0.1:5710"), hub.Transport("10.0.0.2:5710")
	defer a.Close()
	for i := range 10 {
		require.NoError(t, a.Send(b.LocalID(), []byte{byte(i)}))
	}
	var mu sync.Mutex
	var got []byte
	b.Hand(func(ev control.Event) {
		mu.Lock()
		got = append(got, ev.Frame...)
		mu.Unlock()
		assert.NoError(t, b.Send(ev.PeerID, ev.Frame))
	})
	for i := 10; i < 20; i++ {
		require.NoError(t, a.Send(b.LocalID(), []byte{byte(i)}))
	}
	for i := range 20 {
		assert.Equal(t, []byte{byte(i)}, next(t, a).Frame)
	}
	mu.Lock()
	assert.Len(t, got, 20)
	mu.Unlock()
	require.NoError(t, b.Close())
	_, open := <-b.Events()
	assert.False(t, open)
}

package zmqctl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/control"
)

func TestExchangeBothWaysWithSenderIdentity(t *testing.T) {
	a := newTestTransport(t, Options{})
	b := newTestTransport(t, Options{})

	require.NoError(t, a.Send(b.LocalID(), []byte("ping from a")))
	ev := nextEvent(t, b, 5*time.Second)
	assert.Equal(t, control.EventFrame, ev.Kind)
	assert.Equal(t, a.LocalID(), ev.PeerID, "receiver must see the sender's local id")
	assert.Equal(t, []byte("ping from a"), ev.Frame)

	require.NoError(t, b.Send(ev.PeerID, []byte("pong from b")))
	ev = nextEvent(t, a, 5*time.Second)
	assert.Equal(t, control.EventFrame, ev.Kind)
	assert.Equal(t, b.LocalID(), ev.PeerID)
	assert.Equal(t, []byte("pong from b"), ev.Frame)

	assert.Equal(t, uint64(1), a.Stats().FramesOut)
	assert.Equal(t, uint64(1), a.Stats().FramesIn)
	assert.Equal(t, int64(1), a.Stats().OpenPeers)
}

func TestSendCopiesTheFrame(t *testing.T) {
	a := newTestTransport(t, Options{})
	b := newTestTransport(t, Options{})
	frame := []byte("original")
	require.NoError(t, a.Send(b.LocalID(), frame))
	copy(frame, "CLOBBER!")
	assert.Equal(t, []byte("original"), nextEvent(t, b, 5*time.Second).Frame)
}

func TestThousandFramesArriveInOrder(t *testing.T) {
	a := newTestTransport(t, Options{})
	b := newTestTransport(t, Options{})
	const n = 1000
	for i := range n {
		frame := binary.BigEndian.AppendUint32(nil, uint32(i))
		frame = append(frame, make([]byte, i%97)...) // varied sizes
		require.NoError(t, a.Send(b.LocalID(), frame))
	}
	for i := range n {
		ev := nextEvent(t, b, 5*time.Second)
		require.Equal(t, control.EventFrame, ev.Kind)
		require.Len(t, ev.Frame, 4+i%97)
		require.Equal(t, uint32(i), binary.BigEndian.Uint32(ev.Frame), "frame %d out of order", i)
	}
	assert.Equal(t, uint64(n), b.Stats().FramesIn)
	assert.Equal(t, uint64(n), a.Stats().FramesOut)
}

func TestSlowConsumerLosesNothingAndSendsStillFlow(t *testing.T) {
	a := newTestTransport(t, Options{})
	b := newTestTransport(t, Options{EventBuffer: 4})
	const n = 300
	for i := range n {
		require.NoError(t, a.Send(b.LocalID(), binary.BigEndian.AppendUint32(nil, uint32(i))))
	}
	// b's Events is full and nobody reads it; b must still send.
	time.Sleep(200 * time.Millisecond)
	require.NoError(t, b.Send(a.LocalID(), []byte("still sending")))
	assert.Equal(t, []byte("still sending"), nextEvent(t, a, 5*time.Second).Frame)

	for i := range n {
		ev := nextEvent(t, b, 5*time.Second)
		require.Equal(t, uint32(i), binary.BigEndian.Uint32(ev.Frame))
	}
}

func TestSendToNobodyListeningReportsPeerDown(t *testing.T) {
	connectTimeout := 2 * time.Second
	a := newTestTransport(t, Options{ConnectTimeout: connectTimeout})
	nobody := fmt.Sprintf("127.0.0.1:%d", freePort(t))

	start := time.Now()
	require.NoError(t, a.Send(nobody, []byte("hello?")))
	ev := nextEvent(t, a, connectTimeout+10*time.Second)
	assert.Less(t, time.Since(start), connectTimeout+10*time.Second)
	assert.Equal(t, control.EventPeerDown, ev.Kind)
	assert.Equal(t, nobody, ev.PeerID)
	assert.True(t, errors.Is(ev.Err, ErrPeerDisconnected) || errors.Is(ev.Err, ErrConnectTimeout), "err: %v", ev.Err)
	assert.NotContains(t, ev.Err.Error(), nobody, "the event names the peer; its error does not repeat it")
	assert.Equal(t, uint64(1), a.Stats().PeersDown)
	assert.Equal(t, int64(0), a.Stats().OpenPeers)
}

// A refused connection can be told by the monitor before the pump starts
// watching it; the peer must still be reported down once, not twice.
func TestEachRefusedPeerIsReportedDownOnce(t *testing.T) {
	a := newTestTransport(t, Options{ConnectTimeout: 2 * time.Second})
	const n = 40
	want := map[string]bool{}
	for len(want) < n { // the kernel may hand out a port twice
		want[fmt.Sprintf("127.0.0.1:%d", freePort(t))] = true
	}
	for nobody := range want {
		require.NoError(t, a.Send(nobody, []byte("hello?")))
	}
	for range len(want) {
		ev := nextEvent(t, a, 15*time.Second)
		require.Equal(t, control.EventPeerDown, ev.Kind)
		require.True(t, want[ev.PeerID], "unexpected or repeated peer down for %s", ev.PeerID)
		delete(want, ev.PeerID)
	}
	noEvent(t, a, 200*time.Millisecond)
	assert.Equal(t, uint64(n), a.Stats().PeersDown)
	assert.Equal(t, int64(0), a.Stats().OpenPeers)
}

func TestHandshakeDeadlineWithSilentListener(t *testing.T) {
	silent := silentListener(t)
	a := newTestTransport(t, Options{ConnectTimeout: 300 * time.Millisecond})

	start := time.Now()
	require.NoError(t, a.Connect(silent))
	ev := nextEvent(t, a, 3*time.Second)
	elapsed := time.Since(start)
	t.Logf("handshake deadline fired after %v", elapsed)
	assert.Equal(t, control.EventPeerDown, ev.Kind)
	assert.Equal(t, silent, ev.PeerID)
	assert.ErrorIs(t, ev.Err, ErrConnectTimeout)
	assert.GreaterOrEqual(t, elapsed, 300*time.Millisecond)
	assert.Less(t, elapsed, 10*time.Second, "bound is loose for loaded CI boxes")
}

func TestPeerDownAfterPeerCloses(t *testing.T) {
	opts := Options{HeartbeatInterval: 100 * time.Millisecond, HeartbeatTimeout: 500 * time.Millisecond} // no TTL, as shipped
	a := newTestTransport(t, opts)
	b := newTestTransport(t, opts)
	require.NoError(t, a.Send(b.LocalID(), []byte("x")))
	require.Equal(t, control.EventFrame, nextEvent(t, b, 5*time.Second).Kind)

	start := time.Now()
	require.NoError(t, b.Close())
	ev := nextEvent(t, a, 12*time.Second)
	assert.Equal(t, control.EventPeerDown, ev.Kind)
	assert.Equal(t, b.LocalID(), ev.PeerID)
	assert.ErrorIs(t, ev.Err, ErrPeerDisconnected)
	assert.Less(t, time.Since(start), opts.HeartbeatTimeout+10*time.Second)
}

func TestHeartbeatDetectsHungPeer(t *testing.T) {
	opts := Options{HeartbeatInterval: 100 * time.Millisecond, HeartbeatTimeout: 500 * time.Millisecond} // no TTL, as shipped
	a := newTestTransport(t, opts)
	b := newTestTransport(t, opts)
	proxy := newTestProxy(t, b.LocalID())
	require.NoError(t, a.Send(proxy.addr, []byte("through the proxy")))
	ev := nextEvent(t, b, 5*time.Second)
	require.Equal(t, []byte("through the proxy"), ev.Frame)
	require.Equal(t, a.LocalID(), ev.PeerID)

	start := time.Now()
	proxy.blackhole() // b "hangs": TCP stays up, nothing answers
	ev = nextEvent(t, a, 15*time.Second)
	assert.Equal(t, control.EventPeerDown, ev.Kind)
	assert.Equal(t, proxy.addr, ev.PeerID)
	assert.ErrorIs(t, ev.Err, ErrPeerDisconnected)
	// ~600 ms when unloaded; only the heartbeat can see this at all, so a
	// loose bound keeps the test stable on a loaded 2-core box.
	t.Logf("hung peer detected after %v", time.Since(start))
	assert.Less(t, time.Since(start), opts.HeartbeatTimeout+10*time.Second)
}

func TestSendAfterPeerDownOpensFreshConnection(t *testing.T) {
	a := newTestTransport(t, Options{ConnectTimeout: 2 * time.Second})
	port := freePort(t)
	peerID := fmt.Sprintf("127.0.0.1:%d", port)
	require.NoError(t, a.Send(peerID, []byte("lost")))
	require.Equal(t, control.EventPeerDown, nextEvent(t, a, 3*time.Second).Kind)

	b, err := New(peerID, "127.0.0.1", port, Options{Logger: quietLogger})
	if err != nil {
		t.Skipf("port %d was taken meanwhile: %v", port, err)
	}
	defer b.Close()
	require.NoError(t, a.Send(peerID, []byte("found")))
	ev := nextEvent(t, b, 5*time.Second)
	assert.Equal(t, []byte("found"), ev.Frame)
	assert.Equal(t, a.LocalID(), ev.PeerID)
}

func TestDisconnectIsSilentAndReconnectWorks(t *testing.T) {
	a := newTestTransport(t, Options{})
	b := newTestTransport(t, Options{})
	require.NoError(t, a.Send(b.LocalID(), []byte("one")))
	require.Equal(t, []byte("one"), nextEvent(t, b, 5*time.Second).Frame)

	a.Disconnect(b.LocalID())
	noEvent(t, a, 200*time.Millisecond)
	require.Eventually(t, func() bool { return a.Stats().OpenPeers == 0 }, 2*time.Second, 10*time.Millisecond)

	require.NoError(t, a.Send(b.LocalID(), []byte("two")))
	assert.Equal(t, []byte("two"), nextEvent(t, b, 5*time.Second).Frame)
}

// The tier disconnects a peer (a refusal, a session's end) and may speak to
// it again at once (its next connect). Both the goodbye and what follows
// must arrive: a second DEALER dialed under our identity while the first
// lingered would be a connection libzmq's ROUTER never reads (vLLM's has
// no handover), and every frame on it would be lost.
func TestFramesRightAfterADisconnectArrive(t *testing.T) {
	a := newTestTransport(t, Options{})
	b := newTestTransport(t, Options{}) // plaintext: no handover, as vLLM's ROUTER
	for i := range 50 {
		require.NoError(t, a.Send(b.LocalID(), []byte(fmt.Sprintf("goodbye %d", i))))
		a.Disconnect(b.LocalID())
		require.NoError(t, a.Send(b.LocalID(), []byte(fmt.Sprintf("hello %d", i))))
		for _, want := range []string{"goodbye", "hello"} {
			ev := nextEvent(t, b, 2*time.Second)
			require.Equal(t, control.EventFrame, ev.Kind)
			require.Equal(t, fmt.Sprintf("%s %d", want, i), string(ev.Frame))
		}
	}
	a.Disconnect(b.LocalID())
	noEvent(t, a, 100*time.Millisecond) // a disconnected peer is never reported
	require.Eventually(t, func() bool { return a.Stats().OpenPeers == 0 }, 2*time.Second, 10*time.Millisecond)
}

// closeAndLetGo sends one frame to b, disconnects it and waits out the
// linger, so a's next DEALER to b is held back (under 100 ms ago closed).
func closeAndLetGo(t *testing.T, a, b *Transport) {
	t.Helper()
	require.NoError(t, a.Send(b.LocalID(), []byte("first")))
	require.Equal(t, []byte("first"), nextEvent(t, b, 5*time.Second).Frame)
	a.Disconnect(b.LocalID())
	require.Eventually(t, func() bool { return a.Stats().OpenPeers == 0 }, 2*time.Second, time.Millisecond)
}

// A frame sent while the new DEALER waits to dial is not a stalled send:
// a send timeout shorter than the wait must not drop the peer.
func TestASendWaitingForTheRedialIsNotAStall(t *testing.T) {
	a := newTestTransport(t, Options{DisconnectLinger: time.Millisecond, SendTimeout: 20 * time.Millisecond})
	b := newTestTransport(t, Options{})
	closeAndLetGo(t, a, b)
	require.NoError(t, a.Send(b.LocalID(), []byte("again")))
	ev := nextEvent(t, b, 5*time.Second)
	require.Equal(t, control.EventFrame, ev.Kind)
	assert.Equal(t, []byte("again"), ev.Frame)
	noEvent(t, a, 50*time.Millisecond)
}

// A goodbye to a peer just closed, sent and disconnected before the new
// DEALER dials, still gets its whole linger once it does.
func TestAGoodbyeWhileTheRedialWaitsStillArrives(t *testing.T) {
	a := newTestTransport(t, Options{DisconnectLinger: 20 * time.Millisecond})
	b := newTestTransport(t, Options{})
	closeAndLetGo(t, a, b)
	require.NoError(t, a.Send(b.LocalID(), []byte("goodbye")))
	a.Disconnect(b.LocalID())
	ev := nextEvent(t, b, 5*time.Second)
	require.Equal(t, control.EventFrame, ev.Kind)
	assert.Equal(t, []byte("goodbye"), ev.Frame)
	noEvent(t, a, 50*time.Millisecond) // a disconnected peer is never reported
}

func TestPeerThatStopsReadingIsReportedDown(t *testing.T) {
	silent := silentListener(t) // never reads, so libzmq's queue fills
	sendTimeout := 300 * time.Millisecond
	a := newTestTransport(t, Options{SendHWM: 4, SendTimeout: sendTimeout, ConnectTimeout: time.Minute})

	// 4 frames fit in libzmq, 4 more wait in front of it, the 9th is refused.
	for i := range 4 {
		require.NoError(t, a.Send(silent, []byte{byte(i)}), "frame %d", i)
	}
	require.Eventually(t, func() bool { return a.Stats().FramesOut == 4 }, 2*time.Second, time.Millisecond)
	start := time.Now()
	for i := 4; i < 8; i++ {
		require.NoError(t, a.Send(silent, []byte{byte(i)}), "frame %d", i)
	}
	err := a.Send(silent, []byte{8})
	assert.ErrorIs(t, err, ErrSendQueueFull)
	assert.ErrorContains(t, err, silent)

	ev := nextEvent(t, a, 3*time.Second)
	assert.Equal(t, control.EventPeerDown, ev.Kind)
	assert.Equal(t, silent, ev.PeerID)
	assert.ErrorIs(t, ev.Err, ErrSendQueueFull)
	assert.Less(t, time.Since(start), sendTimeout+10*time.Second)
	st := a.Stats()
	assert.Equal(t, uint64(4), st.FramesOut)
	assert.Equal(t, uint64(5), st.DroppedOutbound, "4 waiting frames + 1 refused")
	assert.Equal(t, int64(0), st.OpenPeers)

	// The queue is free again: a fresh DEALER takes new frames.
	require.NoError(t, a.Send(silent, []byte{9}))
}

func TestBurstBeyondLibzmqQueueIsDelivered(t *testing.T) {
	a := newTestTransport(t, Options{SendHWM: 8})
	b := newTestTransport(t, Options{})
	const n = 2000
	sent := 0
	for sent < n {
		err := a.Send(b.LocalID(), binary.BigEndian.AppendUint32(nil, uint32(sent)))
		if errors.Is(err, ErrSendQueueFull) {
			time.Sleep(100 * time.Microsecond)
			continue
		}
		require.NoError(t, err)
		sent++
	}
	for i := range n {
		ev := nextEvent(t, b, 5*time.Second)
		require.Equal(t, control.EventFrame, ev.Kind)
		require.Equal(t, uint32(i), binary.BigEndian.Uint32(ev.Frame))
	}
	noEvent(t, a, 50*time.Millisecond) // no spurious PeerDown
}

func TestSendFailsFastWhenPumpFallsBehind(t *testing.T) {
	stall, release := make(chan struct{}), make(chan struct{})
	var stalled atomic.Bool
	opts := Options{SendHWM: 4, pumpHook: func() {
		select {
		case <-stall:
			if stalled.CompareAndSwap(false, true) {
				<-release
			}
		default:
		}
	}}
	a := newTestTransport(t, opts)
	b := newTestTransport(t, Options{})
	close(stall)
	require.NoError(t, a.Connect(b.LocalID())) // wakes the pump into the stall
	require.Eventually(t, stalled.Load, 2*time.Second, time.Millisecond)

	for i := range 4 {
		require.NoError(t, a.Send(b.LocalID(), []byte{byte(i)}))
	}
	err := a.Send(b.LocalID(), []byte{4})
	assert.ErrorIs(t, err, ErrSendQueueFull)
	assert.ErrorContains(t, err, b.LocalID())

	close(release)
	for i := range 4 {
		assert.Equal(t, []byte{byte(i)}, nextEvent(t, b, 5*time.Second).Frame)
	}
	require.NoError(t, a.Send(b.LocalID(), []byte("room again")))
	assert.Equal(t, []byte("room again"), nextEvent(t, b, 5*time.Second).Frame)
}

func TestCloseIsFastWithFramesQueuedToDeadPeer(t *testing.T) {
	silent := silentListener(t)
	a := newTestTransport(t, Options{ConnectTimeout: time.Minute})
	nobody := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	for i := range 500 {
		require.NoError(t, a.Send(silent, []byte(fmt.Sprint("queued ", i))))
	}
	_ = a.Send(nobody, []byte("never"))

	start := time.Now()
	require.NoError(t, a.Close())
	assert.Less(t, time.Since(start), time.Second)
	require.NoError(t, a.Close(), "Close is idempotent")

	for range a.Events() { // must be closed, possibly after a few buffered events
	}
	assert.ErrorIs(t, a.Send(silent, []byte("late")), control.ErrClosed)
	assert.ErrorIs(t, a.Connect(silent), control.ErrClosed)
	a.Disconnect(silent) // must not panic or block
}

func TestBindFailureNamesTheAddress(t *testing.T) {
	a := newTestTransport(t, Options{})
	port := portOf(t, a.LocalID())
	_, err := New(fmt.Sprintf("127.0.0.1:%d", port), "127.0.0.1", port, Options{Logger: quietLogger})
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("tcp://127.0.0.1:%d", port))
	assert.Contains(t, err.Error(), "in use")

	_, err = New("127.0.0.1:5999", "256.0.0.1", 5999, Options{Logger: quietLogger})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "tcp://256.0.0.1:5999")
}

func TestNewValidatesArguments(t *testing.T) {
	_, err := New("no-port", "127.0.0.1", 5999, Options{})
	assert.ErrorIs(t, err, control.ErrBadPeerID)
	_, err = New("127.0.0.1:5999", "127.0.0.1", 5999, Options{ConnectTimeout: -time.Second})
	assert.ErrorContains(t, err, "ConnectTimeout")
}

func TestMultiFrameMessagesAreDropped(t *testing.T) {
	b := newTestTransport(t, Options{})
	ctx, err := zmq.NewContext()
	require.NoError(t, err)
	defer ctx.Term()
	raw, err := newSocket(ctx, zmq.DEALER)
	require.NoError(t, err)
	defer raw.Close()
	require.NoError(t, raw.SetIdentity("127.0.0.1:1"))
	require.NoError(t, raw.Connect("tcp://"+b.LocalID()))

	_, err = raw.SendMessage("part one", "part two")
	require.NoError(t, err)
	_, err = raw.SendBytes([]byte("single"), 0)
	require.NoError(t, err)

	ev := nextEvent(t, b, 5*time.Second)
	assert.Equal(t, []byte("single"), ev.Frame)
	assert.Equal(t, "127.0.0.1:1", ev.PeerID)
	assert.Equal(t, uint64(1), b.Stats().DroppedInbound)
	assert.Equal(t, uint64(1), b.Stats().FramesIn)
}

func TestBadPeerIDsAreRejected(t *testing.T) {
	a := newTestTransport(t, Options{})
	for _, id := range []string{"", "host", ":5710", "host:0", "host:70000", "host:port", "1.2.3.4:-1"} {
		assert.ErrorIs(t, a.Send(id, []byte("x")), control.ErrBadPeerID, "id %q", id)
		assert.ErrorIs(t, a.Connect(id), control.ErrBadPeerID, "id %q", id)
	}
}

func TestParsePeerID(t *testing.T) {
	cases := map[string]endpoint{
		"127.0.0.1:5710": {addr: "tcp://127.0.0.1:5710"},
		"localhost:80":   {addr: "tcp://localhost:80"},
		"[::1]:5710":     {addr: "tcp://[::1]:5710", ipv6: true},
		"::1:5710":       {addr: "tcp://[::1]:5710", ipv6: true}, // vLLM's spelling
	}
	for id, want := range cases {
		got, err := parsePeerID(id)
		require.NoError(t, err, id)
		assert.Equal(t, want, got, id)
	}
}

func TestIPv6Loopback(t *testing.T) {
	l, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	}
	portA := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	a, err := New(fmt.Sprintf("[::1]:%d", portA), "::1", portA, Options{Logger: quietLogger})
	require.NoError(t, err)
	defer a.Close()
	b := newTestTransport(t, Options{})

	require.NoError(t, a.Send(b.LocalID(), []byte("from v6 side")))
	ev := nextEvent(t, b, 5*time.Second)
	assert.Equal(t, a.LocalID(), ev.PeerID)
	require.NoError(t, b.Send(ev.PeerID, []byte("to v6 side")))
	ev = nextEvent(t, a, 5*time.Second)
	assert.Equal(t, []byte("to v6 side"), ev.Frame)
	assert.Equal(t, "::1", ev.Addr)
}

func TestPumpPanicMarksTransportDead(t *testing.T) {
	armed := make(chan struct{})
	opts := Options{pumpHook: func() {
		select {
		case <-armed:
			panic("injected")
		default:
		}
	}}
	a := newTestTransport(t, opts)
	close(armed)
	require.NoError(t, a.Connect("127.0.0.1:1")) // wakes the pump

	select {
	case _, ok := <-a.Events():
		for ok {
			_, ok = <-a.Events()
		}
	case <-time.After(5 * time.Second):
		t.Fatal("events channel not closed after the pump died")
	}
	err := a.Send("127.0.0.1:1", []byte("x"))
	assert.ErrorIs(t, err, control.ErrClosed)
	assert.ErrorContains(t, err, "injected")
	assert.ErrorContains(t, a.Close(), "injected")
}

package zmqctl

import (
	"bytes"
	"fmt"
	"log/slog"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/control"
)

const mib = 1 << 20

// Strangers flooding a receiver that reads slower than they send: each
// connection may hold only RecvHWM frames in libzmq (libzmq's default was
// 1000, each up to MaxFrameBytes), and a legitimate sender still gets
// through.
func TestStrangersCannotPileFramesUpInTheReceiver(t *testing.T) {
	const frame, identities, perIdentity = 256 << 10, 8, 200
	v := startVictim(t, victimSpec{MaxFrameBytes: frame, EventBuffer: 1, ConsumeDelayMS: 5})
	legit := newRawDealer(t, "legit-1", v.id)
	_, err := legit.sock.SendBytes([]byte("hello"), 0)
	require.NoError(t, err)
	_, ok := v.await("frame legit-1", 10*time.Second)
	require.True(t, ok, "the legitimate sender's first frame")
	base := v.rss(t)

	attackers := make([]*rawDealer, identities)
	for i := range attackers {
		attackers[i] = newRawDealer(t, fmt.Sprintf("stranger-%d", i), v.id,
			func(s *zmq.Socket) error { return s.SetSndhwm(4) }) // what they send sits in the victim, not here
	}
	payload := make([]byte, frame)
	sent, total := make([]int, identities), 0
	legitSent := false
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end) && total < identities*perIdentity; {
		progress := false
		for i, a := range attackers {
			if sent[i] < perIdentity {
				if _, err := a.sock.SendBytes(payload, zmq.DONTWAIT); err == nil {
					sent[i]++
					total++
					progress = true
				}
			}
		}
		if !legitSent && total > identities*8 {
			_, err := legit.sock.SendBytes([]byte("during the flood"), 0)
			require.NoError(t, err)
			legitSent = true
		}
		if !progress {
			time.Sleep(time.Millisecond)
		}
	}
	held := v.rss(t) - base
	st := v.stats(t)
	t.Logf("%d frames of %d KiB sent by %d strangers; the victim holds %+d MiB; %d inbound connections",
		total, frame>>10, identities, held/mib, st.InboundConns)
	assert.Less(t, held, int64(64*mib*memoryFactor), "frames piled up in the receiver")
	assert.True(t, legitSent, "the flood never started")
	_, ok = v.await("frame legit-1", 10*time.Second)
	assert.True(t, ok, "the legitimate sender's frame during the flood")
}

// Connections dialled under an identity already in use are never read by
// a ROUTER without handover: the victim shuts them down once they have
// been unheard for UnheardTimeout, and the peer that holds the identity
// goes on. What libzmq took from each before that stays with the ROUTER
// (it never reads or frees such a pipe): RecvHWM frames and the one after,
// not libzmq's 1000.
func TestDuplicateIdentityConnectionsAreClosedAndHoldOnlyTheirBound(t *testing.T) {
	const frame, duplicates, perDuplicate = 4 * mib, 3, 12
	v := startVictim(t, victimSpec{MaxFrameBytes: frame, UnheardTimeoutMS: 1000})
	legit := newRawDealer(t, "legit-dup", v.id)
	_, err := legit.sock.SendBytes([]byte("first"), 0)
	require.NoError(t, err)
	_, ok := v.await("frame legit-dup", 10*time.Second)
	require.True(t, ok, "the identity's owner")
	base := v.rss(t)

	noRedial := func(s *zmq.Socket) error { return s.SetReconnectIvl(time.Minute) }
	payload := make([]byte, frame)
	var wg sync.WaitGroup
	closed := make([]bool, duplicates)
	for i := range duplicates {
		d := newRawDealer(t, "legit-dup", v.id, noRedial)
		require.True(t, d.awaitEvent(zmq.EVENT_HANDSHAKE_SUCCEEDED, 5*time.Second), "duplicate %d connects", i)
		for range perDuplicate {
			_, err := d.sock.SendBytes(payload, 0)
			require.NoError(t, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			closed[i] = d.awaitEvent(zmq.EVENT_DISCONNECTED, 8*time.Second)
		}()
	}
	wg.Wait()
	held := v.rss(t) - base
	st := v.stats(t)
	t.Logf("%d duplicates x %d frames of %d MiB: closed %v, the victim holds %+d MiB, %d connections shut",
		duplicates, perDuplicate, frame/mib, closed, held/mib, st.InboundShut)
	for i, c := range closed {
		assert.True(t, c, "duplicate %d was left open", i)
	}
	bound := int64(duplicates * (DefaultRecvHWM + 1) * frame)
	assert.LessOrEqual(t, held, bound+8*mib*memoryFactor, "unread duplicate connections hold more than their bound")

	_, err = legit.sock.SendBytes([]byte("after"), 0)
	require.NoError(t, err)
	_, ok = v.await("frame legit-dup", 10*time.Second)
	assert.True(t, ok, "the identity's owner after the duplicates")
}

// A peer that never reads what we send it: libzmq's queue (SocketSendHWM
// frames) and ours (SendQueueBytes) bound what waits for it, it is reported
// down SendTimeout after it stopped draining, and its memory is freed; a
// peer that reads gets every frame meanwhile.
func TestPeerThatNeverReadsIsReapedAndItsQueueFreed(t *testing.T) {
	const sendTimeout = time.Second
	v := startVictim(t, victimSpec{SendTimeoutMS: int(sendTimeout / time.Millisecond)})
	_, silent := fakePeer(t, true)
	reader := newTestTransport(t, Options{})
	base := v.rss(t)

	start := time.Now()
	v.ask(t, fmt.Sprintf("send %s %d 400 5", silent, mib))
	v.ask(t, fmt.Sprintf("send %s 1024 40 50", reader.LocalID()))
	var peak int64
	var down string
	for down == "" && time.Since(start) < sendTimeout+9*time.Second {
		down, _ = v.await("down "+silent, 250*time.Millisecond)
		peak = max(peak, v.rss(t)-base)
	}
	reapedAfter := time.Since(start)
	time.Sleep(300 * time.Millisecond)
	after := v.rss(t) - base
	st := v.stats(t)
	t.Logf("reaped after %v: %q; peak %+d MiB, after %+d MiB; stats %+v", reapedAfter, down, peak/mib, after/mib, st)
	assert.NotEmpty(t, down, "the peer that never reads was not reported down")
	assert.Contains(t, down, ErrSendQueueFull.Error())
	assert.Less(t, peak, int64(96*mib*memoryFactor), "answers queued for a peer that never reads")
	assert.Less(t, after, int64(24*mib*memoryFactor), "memory held after the peer was dropped")
	assert.Zero(t, st.QueuedSendBytes)

	got := 0
	for end := time.After(10 * time.Second); got < 40; {
		select {
		case ev := <-reader.Events():
			if ev.Kind == control.EventFrame && ev.PeerID == v.id {
				got++
			}
		case <-end:
			t.Fatalf("the reading peer got %d of 40 frames", got)
		}
	}
}

// An encrypt mismatch on the control path is named as one, on the dialling
// side (the lost peer's error) and on the listening side (a warning with
// the peer's address), not only as libzmq's handshake event.
func TestEncryptMismatchIsNamed(t *testing.T) {
	keys := curveKeys(t, "cluster secret")
	cases := map[string]struct {
		client, server *CurveKeys
		clientSays     string
	}{
		"encrypt dials plaintext": {keys, nil, "this node has encrypt on"},
		"plaintext dials encrypt": {nil, keys, "this node has encrypt off"},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			logs := &lockedBuffer{}
			a := newTestTransport(t, Options{Curve: c.client, ConnectTimeout: 5 * time.Second})
			b := newTestTransport(t, Options{Curve: c.server,
				Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelWarn}))})
			require.NoError(t, a.Send(b.LocalID(), []byte("never delivered")))
			ev := nextEvent(t, a, 10*time.Second)
			require.Equal(t, control.EventPeerDown, ev.Kind)
			t.Logf("dialler: %v", ev.Err)
			assert.ErrorIs(t, ev.Err, ErrPeerDisconnected)
			assert.ErrorContains(t, ev.Err, "CURVE/encrypt mismatch")
			assert.ErrorContains(t, ev.Err, c.clientSays)
			assert.Eventually(t, func() bool { return strings.Contains(logs.String(), "CURVE/encrypt mismatch") },
				5*time.Second, 10*time.Millisecond, "listener's log: %s", logs.String())
			t.Logf("listener: %s", logs.String())
			assert.Contains(t, logs.String(), "inbound control handshake failed")
		})
	}
}

// lockedBuffer is a log sink safe for the pump's goroutine and the test.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// Connections beyond MaxInboundConnsPerHost from one address are shut down
// as they arrive; those within it stay and are heard.
func TestInboundConnectionsPerHostAreBounded(t *testing.T) {
	const perHost, dialers = 2, 5
	b := newTestTransport(t, Options{MaxInboundConnsPerHost: perHost})
	var wg sync.WaitGroup
	dropped := make([]bool, dialers)
	for i := range dialers {
		d := newRawDealer(t, fmt.Sprintf("127.0.0.1:%d", 20000+i), b.LocalID(),
			func(s *zmq.Socket) error { return s.SetReconnectIvl(time.Minute) })
		require.True(t, d.awaitEvent(zmq.EVENT_CONNECTED, 5*time.Second), "dialer %d", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			dropped[i] = d.awaitEvent(zmq.EVENT_DISCONNECTED, 2*time.Second)
		}()
	}
	wg.Wait()
	shut := 0
	for _, d := range dropped {
		if d {
			shut++
		}
	}
	st := b.Stats()
	t.Logf("dropped %v; stats %+v", dropped, st)
	assert.Equal(t, dialers-perHost, shut, "connections over the per-host bound")
	assert.Equal(t, uint64(dialers-perHost), st.InboundShut)
	assert.Equal(t, int64(perHost), st.InboundConns)
}

// The byte bounds limit what piles up for a peer, not the largest frame we
// may send: a frame larger than SendQueueBytes still goes out when nothing
// waits in front of it (a lookup's answer may be as large as the frame
// bound allows).
func TestAFrameLargerThanTheQueueBoundGoesOutToAnEmptyQueue(t *testing.T) {
	a := newTestTransport(t, Options{SendQueueBytes: 1 << 20, TotalSendQueueBytes: 1 << 20})
	b := newTestTransport(t, Options{})
	frame := make([]byte, 3<<20)
	frame[len(frame)-1] = 7
	require.NoError(t, a.Send(b.LocalID(), frame))
	for {
		ev := nextEvent(t, b, 10*time.Second)
		if ev.Kind == control.EventFrame {
			require.Equal(t, frame, ev.Frame)
			return
		}
	}
}

// With AdmitAddr (a node's allowed_peers) a connection from an address
// outside it is shut down as it is accepted, so whatever it sends is never
// queued for long; one from inside stays and is read.
func TestConnectionsFromAddressesNotAdmittedAreShutAtAccept(t *testing.T) {
	b := newTestTransport(t, Options{AdmitAddr: func(a netip.Addr) bool { return a == netip.MustParseAddr("127.0.0.1") }})
	// "source;destination": libzmq binds the dialing end to 127.0.0.2.
	outside := newRawDealer(t, "127.0.0.1:20100", "127.0.0.2:0;"+b.LocalID(), func(s *zmq.Socket) error {
		return s.SetReconnectIvl(time.Minute)
	})
	assert.True(t, outside.awaitEvent(zmq.EVENT_DISCONNECTED, 5*time.Second), "the outside connection is shut")
	inside := newRawDealer(t, "127.0.0.1:20101", b.LocalID(), func(s *zmq.Socket) error {
		return s.SetReconnectIvl(time.Minute)
	})
	require.True(t, inside.awaitEvent(zmq.EVENT_CONNECTED, 5*time.Second))
	assert.False(t, inside.awaitEvent(zmq.EVENT_DISCONNECTED, 500*time.Millisecond), "an admitted connection stays")
	st := b.Stats()
	assert.Equal(t, uint64(1), st.InboundShut)
	assert.Equal(t, uint64(1), st.InboundNotAdmitted)
	assert.Equal(t, int64(1), st.InboundConns)
}

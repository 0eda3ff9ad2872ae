package zmqctl

import (
	"bytes"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/control"
)

// memoryNow returns the live Go heap after a GC and the process RSS, with
// freed Go memory handed back to the OS first so RSS shows what is held.
func memoryNow(t *testing.T) (heap, rss uint64) {
	t.Helper()
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	statm, err := os.ReadFile("/proc/self/statm")
	require.NoError(t, err)
	fields := strings.Fields(string(statm))
	require.GreaterOrEqual(t, len(fields), 2)
	pages, err := strconv.ParseUint(fields[1], 10, 64)
	require.NoError(t, err)
	return ms.HeapAlloc, pages * uint64(os.Getpagesize())
}

// rawDealer is a bare pebbe DEALER in its own context, standing in for a
// foreign process, with a monitor on its connection.
type rawDealer struct {
	sock, monitor *zmq.Socket
	close         func() // idempotent; also run at cleanup
}

// setup, if any, sets socket options before it connects.
func newRawDealer(t *testing.T, identity, target string, setup ...func(*zmq.Socket) error) *rawDealer {
	t.Helper()
	ctx, err := zmq.NewContext()
	require.NoError(t, err)
	d := &rawDealer{}
	d.sock, err = newSocket(ctx, zmq.DEALER)
	require.NoError(t, err)
	require.NoError(t, d.sock.SetIdentity(identity))
	monitorAddr := fmt.Sprintf("inproc://raw-dealer-%p", d)
	require.NoError(t, d.sock.Monitor(monitorAddr, zmq.EVENT_ALL))
	d.monitor, err = newSocket(ctx, zmq.PAIR)
	require.NoError(t, err)
	require.NoError(t, d.monitor.Connect(monitorAddr))
	for _, set := range setup {
		require.NoError(t, set(d.sock))
	}
	require.NoError(t, d.sock.Connect("tcp://"+target))
	closed := false
	closeAll := func() {
		if !closed {
			closed = true
			_ = d.sock.Monitor("", 0)
			d.monitor.Close()
			d.sock.Close()
			_ = ctx.Term()
		}
	}
	t.Cleanup(closeAll)
	d.close = closeAll
	return d
}

// awaitEvent waits for one of the monitor events in want.
func (d *rawDealer) awaitEvent(want zmq.Event, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		_ = d.monitor.SetRcvtimeo(time.Until(deadline))
		event, _, _, err := d.monitor.RecvEvent(0)
		if err != nil {
			return false
		}
		if event&want != 0 {
			return true
		}
	}
	return false
}

// A frame over MaxFrameBytes is refused by libzmq from its header: the
// receiver neither delivers nor buffers it, and stays open to others.
func TestOversizedFrameIsRefusedBeforeItIsBuffered(t *testing.T) {
	const limit, huge = 1 << 20, 256 << 20
	b := newTestTransport(t, Options{MaxFrameBytes: limit})
	heap0, rss0 := memoryNow(t)

	func() {
		raw := newRawDealer(t, "127.0.0.1:1", b.LocalID())
		defer raw.close()
		require.True(t, raw.awaitEvent(zmq.EVENT_HANDSHAKE_SUCCEEDED, 5*time.Second))
		_, err := raw.sock.SendBytes(make([]byte, huge), 0)
		require.NoError(t, err)
		// b drops the connection once it reads the header; without the
		// bound it takes the whole frame and delivers it instead.
		dropped := raw.awaitEvent(zmq.EVENT_DISCONNECTED, 10*time.Second)
		t.Logf("receiver dropped the sender: %v", dropped)
	}()
	select {
	case ev := <-b.Events():
		t.Fatalf("event for the oversized frame: kind %v, %d bytes", ev.Kind, len(ev.Frame))
	case <-time.After(300 * time.Millisecond):
	}

	heap1, rss1 := memoryNow(t)
	t.Logf("heap %+d KiB, RSS %+d KiB for a %d MiB frame", (int64(heap1)-int64(heap0))>>10, (int64(rss1)-int64(rss0))>>10, huge>>20)
	assert.Less(t, int64(heap1)-int64(heap0), int64(huge/8), "Go heap grew")
	assert.Less(t, int64(rss1)-int64(rss0), int64(huge/8), "RSS grew")
	assert.Equal(t, uint64(0), b.Stats().FramesIn)

	a := newTestTransport(t, Options{})
	require.NoError(t, a.Send(b.LocalID(), []byte("after the attack")))
	ev := nextEvent(t, b, 5*time.Second)
	assert.Equal(t, []byte("after the attack"), ev.Frame)
	assert.Equal(t, a.LocalID(), ev.PeerID)
}

// MaxFrameBytes bounds the payload exactly, with and without CURVE (which
// adds its own bytes on the wire); one byte more costs the sender its
// connection, reported as a lost peer, and the next Send dials afresh.
func TestFrameBoundIsExactInBothModes(t *testing.T) {
	keys, err := DeriveCurveKeys("bound test secret")
	require.NoError(t, err)
	for name, curve := range map[string]*CurveKeys{"plaintext": nil, "curve": &keys} {
		t.Run(name, func(t *testing.T) {
			const limit = 64 << 10
			a := newTestTransport(t, Options{Curve: curve})
			b := newTestTransport(t, Options{Curve: curve, MaxFrameBytes: limit})

			atLimit := bytes.Repeat([]byte{7}, limit)
			require.NoError(t, a.Send(b.LocalID(), atLimit))
			assert.Equal(t, atLimit, nextEvent(t, b, 5*time.Second).Frame)

			require.NoError(t, a.Send(b.LocalID(), append(atLimit, 7)))
			ev := nextEvent(t, a, 5*time.Second)
			assert.Equal(t, control.EventPeerDown, ev.Kind)
			assert.ErrorIs(t, ev.Err, ErrPeerDisconnected)
			noEvent(t, b, 100*time.Millisecond)

			require.NoError(t, a.Send(b.LocalID(), []byte("small again")))
			assert.Equal(t, []byte("small again"), nextEvent(t, b, 5*time.Second).Frame)
		})
	}
}

// pushingRouter binds a ROUTER that sends, as no honest peer does, to the
// DEALERs dialing it: SNDHWM 1 so what it sends is not held on its side.
func pushingRouter(t *testing.T) (*zmq.Socket, string) {
	t.Helper()
	ctx, err := zmq.NewContext()
	require.NoError(t, err)
	r, err := newSocket(ctx, zmq.ROUTER)
	require.NoError(t, err)
	t.Cleanup(func() {
		r.Close()
		_ = ctx.Term()
	})
	// Set before Bind: accepted connections take the options of bind time.
	require.NoError(t, r.SetSndhwm(1))
	require.NoError(t, r.SetRouterMandatory(1))
	peerID := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	require.NoError(t, r.Bind("tcp://"+peerID))
	return r, peerID
}

// The bound holds on DEALERs too: a peer we dial that sends us an
// oversized frame loses its connection.
func TestOversizedFrameAtOurDealerDropsThePeer(t *testing.T) {
	const limit = 1 << 20
	remote, peerID := pushingRouter(t)
	a := newTestTransport(t, Options{MaxFrameBytes: limit})
	require.NoError(t, a.Connect(peerID))
	big := make([]byte, 2*limit)
	require.Eventually(t, func() bool {
		_, err := remote.SendMessageDontwait(a.LocalID(), big)
		return err == nil
	}, 5*time.Second, time.Millisecond, "the connection never came up")
	ev := nextEvent(t, a, 5*time.Second)
	assert.Equal(t, control.EventPeerDown, ev.Kind)
	assert.Equal(t, peerID, ev.PeerID)
	assert.ErrorIs(t, ev.Err, ErrPeerDisconnected)
}

// Peers never send on our DEALERs; one that does must not make us buffer
// it (libzmq's default would hold 1000 frames, each up to MaxFrameBytes).
func TestFramesPushedAtOurDealerAreNotBuffered(t *testing.T) {
	const frame, tries = 1 << 20, 100
	remote, peerID := pushingRouter(t)
	a := newTestTransport(t, Options{MaxFrameBytes: frame})
	require.NoError(t, a.Connect(peerID))

	payload := make([]byte, frame)
	sent := 0
	deadline := time.Now().Add(1500 * time.Millisecond)
	for sent < tries && time.Now().Before(deadline) {
		_, err := remote.SendMessageDontwait(a.LocalID(), payload)
		if err != nil { // not routable yet, or our side stopped taking
			time.Sleep(time.Millisecond)
			continue
		}
		sent++
	}
	t.Logf("%d of %d frames of %d KiB taken", sent, tries, frame>>10)
	assert.Greater(t, sent, 0, "the connection never came up")
	assert.Less(t, sent, tries/2, "our DEALER buffered what nobody reads")
}

func TestFramesCarryTheSourceAddressNotTheClaim(t *testing.T) {
	a := newTestTransport(t, Options{})
	b := newTestTransport(t, Options{})
	require.NoError(t, a.Send(b.LocalID(), []byte("honest")))
	ev := nextEvent(t, b, 5*time.Second)
	assert.Equal(t, a.LocalID(), ev.PeerID)
	assert.Equal(t, "127.0.0.1", ev.Addr)

	raw := newRawDealer(t, "10.9.9.9:5710", b.LocalID())
	_, err := raw.sock.SendBytes([]byte("claims another host"), 0)
	require.NoError(t, err)
	ev = nextEvent(t, b, 5*time.Second)
	assert.Equal(t, "10.9.9.9:5710", ev.PeerID, "the id is whatever the sender claims")
	assert.Equal(t, "127.0.0.1", ev.Addr, "the address is where the connection comes from")
}

func TestPeerAddress(t *testing.T) {
	cases := map[string]string{
		"127.0.0.1":             "127.0.0.1",
		"::1":                   "::1",
		"::ffff:10.0.0.1":       "10.0.0.1", // dual-stack socket, IPv4 peer
		"fe80::1%eth0":          "fe80::1%eth0",
		"":                      "",
		"tcp://127.0.0.1":       "",
		"127.0.0.1:5710":        "",
		"not an address at all": "",
	}
	for in, want := range cases {
		assert.Equal(t, want, peerAddress(map[string]string{peerAddressProperty: in}), "%q", in)
	}
	assert.Equal(t, "", peerAddress(nil))
}

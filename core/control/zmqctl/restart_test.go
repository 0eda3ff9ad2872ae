package zmqctl

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/control"
)

// deadIncarnation stands in for a peer's process that died without a FIN
// reaching us: a plain TCP connection that speaks ZMTP 3.1 as a DEALER under
// identity, sends one frame, then neither reads nor writes again (it does
// not answer our heartbeat PINGs), while the kernel keeps it open.
func deadIncarnation(t *testing.T, target, identity string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", target)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	greeting := make([]byte, 64)
	greeting[0], greeting[9], greeting[10], greeting[11] = 0xff, 0x7f, 3, 1 // signature, ZMTP 3.1
	copy(greeting[12:], "NULL")
	property := func(name, value string) []byte {
		b := append([]byte{byte(len(name))}, name...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(value)))
		return append(b, value...)
	}
	ready := append([]byte{5}, "READY"...)
	ready = append(ready, property("Socket-Type", "DEALER")...)
	ready = append(ready, property("Identity", identity)...)
	frame := []byte("from the old incarnation")
	_, err = c.Write(greeting)
	require.NoError(t, err)
	theirs := make([]byte, 64)
	_, err = io.ReadFull(c, theirs)
	require.NoError(t, err)
	out := append([]byte{0x04, byte(len(ready))}, ready...)
	out = append(out, 0x00, byte(len(frame)))
	out = append(out, frame...)
	_, err = c.Write(out)
	require.NoError(t, err)
	return c
}

// A peer restarted on the same address while its old connection is still
// open here and silent (a crash whose FIN never came): the new incarnation
// is heard within a quarter of the default handshake timeout, in plaintext,
// where libzmq never reads a second connection under an identity in use.
// A stranger dialing under a live, idle peer's identity from the same
// address meanwhile gets nothing through, and the live peer keeps its
// connection.
func TestRestartedPeerIsHeardWhileItsDeadConnectionStaysOpen(t *testing.T) {
	const trials = 5
	const bound = 30 * time.Second / 4 // handshake_timeout_s's default / 4
	// A long UnheardTimeout: the restarted peers must be heard because the
	// dead connections yield, not because theirs were shut and redialed
	// (which libzmq 4.3.4's DEALER, the stand-in here, does not survive
	// while its connection is stalled: "!_io_error" in stream_engine_base).
	us := newTestTransport(t, Options{HeartbeatInterval: time.Second, UnheardTimeout: time.Minute})

	live := newRawDealer(t, "live-peer", us.LocalID())
	_, err := live.sock.SendBytes([]byte("live hello"), 0)
	require.NoError(t, err)
	for i := range trials {
		deadIncarnation(t, us.LocalID(), fmt.Sprintf("restarted-%d", i))
	}
	heard := map[string]bool{}
	for len(heard) < trials+1 {
		ev := nextEvent(t, us, 10*time.Second)
		require.Equal(t, control.EventFrame, ev.Kind)
		heard[ev.PeerID] = true
	}

	// The restarts come back a moment later (a process restart), and send
	// every 100 ms until heard (requests keep arriving); so does a stranger
	// under the live peer's identity.
	time.Sleep(500 * time.Millisecond)
	started := time.Now()
	restarted := make([]*rawDealer, trials)
	for i := range trials {
		restarted[i] = newRawDealer(t, fmt.Sprintf("restarted-%d", i), us.LocalID())
	}
	stranger := newRawDealer(t, "live-peer", us.LocalID())
	took := map[string]time.Duration{}
	for time.Since(started) < 3*bound/2 && len(took) < trials {
		for i, d := range restarted {
			if _, done := took[fmt.Sprintf("restarted-%d", i)]; !done {
				_, _ = d.sock.SendBytes([]byte("new incarnation"), zmq.DONTWAIT)
			}
		}
		_, _ = stranger.sock.SendBytes([]byte("stranger"), zmq.DONTWAIT)
		deadline := time.After(100 * time.Millisecond)
	drain:
		for {
			select {
			case ev := <-us.Events():
				require.Equal(t, control.EventFrame, ev.Kind)
				if string(ev.Frame) == "stranger" {
					require.NotEqual(t, "live-peer", ev.PeerID, "a stranger got frames in under a live peer's identity")
				}
				if string(ev.Frame) == "new incarnation" {
					if _, seen := took[ev.PeerID]; !seen {
						took[ev.PeerID] = time.Since(started)
					}
				}
			case <-deadline:
				break drain
			}
		}
	}
	t.Logf("restarted peers first heard after %v (bound %v)", took, bound)
	for i := range trials {
		id := fmt.Sprintf("restarted-%d", i)
		d, ok := took[id]
		if assert.True(t, ok, "%s was never heard", id) {
			assert.Less(t, d, bound, "%s heard late", id)
		}
	}

	// The live peer, silent the whole time but answering our PINGs, was not
	// cut off: its next frame arrives on its connection.
	_, err = live.sock.SendBytes([]byte("live again"), 0)
	require.NoError(t, err)
	for {
		ev := nextEvent(t, us, 5*time.Second)
		if string(ev.Frame) == "stranger" {
			require.NotEqual(t, "live-peer", ev.PeerID, "a stranger got frames in under a live peer's identity")
		}
		if string(ev.Frame) == "live again" {
			assert.Equal(t, "live-peer", ev.PeerID)
			break
		}
	}
	assert.False(t, live.awaitEvent(zmq.EVENT_DISCONNECTED, 10*time.Millisecond), "the live peer's connection was dropped")
}

// Redial drops the DEALER at once: the next Send reaches the peer on a new
// connection, where Disconnect would have let it take the old one back.
func TestRedialDialsANewConnection(t *testing.T) {
	ctx, err := zmq.NewContext()
	require.NoError(t, err)
	router, err := newSocket(ctx, zmq.ROUTER)
	require.NoError(t, err)
	monitor, err := newSocket(ctx, zmq.PAIR)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = router.Monitor("", 0)
		monitor.Close()
		router.Close()
		_ = ctx.Term()
	})
	require.NoError(t, router.Monitor("inproc://redial-test", zmq.EVENT_ACCEPTED))
	require.NoError(t, monitor.Connect("inproc://redial-test"))
	port := freePort(t)
	require.NoError(t, router.Bind(fmt.Sprintf("tcp://127.0.0.1:%d", port)))
	peerID := fmt.Sprintf("127.0.0.1:%d", port)
	accepted := func(within time.Duration) int {
		n := 0
		_ = monitor.SetRcvtimeo(within)
		for {
			if _, _, _, err := monitor.RecvEvent(0); err != nil {
				return n
			}
			n++
			_ = monitor.SetRcvtimeo(100 * time.Millisecond)
		}
	}
	receive := func(want string) {
		t.Helper()
		require.NoError(t, router.SetRcvtimeo(5*time.Second))
		parts, err := router.RecvMessageBytes(0)
		require.NoError(t, err)
		assert.Equal(t, want, string(parts[len(parts)-1]))
	}
	us := newTestTransport(t, Options{})

	require.NoError(t, us.Send(peerID, []byte("first")))
	receive("first")
	assert.Equal(t, 1, accepted(5*time.Second))
	us.Disconnect(peerID)
	require.NoError(t, us.Send(peerID, []byte("taken back")))
	receive("taken back")
	assert.Equal(t, 0, accepted(300*time.Millisecond), "Disconnect then Send reuses the connection")

	us.Redial(peerID)
	require.NoError(t, us.Send(peerID, []byte("fresh")))
	receive("fresh")
	assert.Equal(t, 1, accepted(5*time.Second), "Redial then Send dials a new connection")
}

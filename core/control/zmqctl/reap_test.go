package zmqctl

import (
	"fmt"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/control"
)

// foreignDealer is a remote peer's DEALER under identity id, as vLLM's or an
// older peerkv's would be; pinging sets vLLM's heartbeat (scaled down).
func foreignDealer(t *testing.T, ctx *zmq.Context, id, addr string, pinging bool) *zmq.Socket {
	d, err := ctx.NewSocket(zmq.DEALER)
	require.NoError(t, err)
	require.NoError(t, d.SetLinger(0))
	require.NoError(t, d.SetIdentity(id))
	if pinging {
		require.NoError(t, d.SetHeartbeatIvl(time.Second))
		require.NoError(t, d.SetHeartbeatTimeout(time.Second))
		require.NoError(t, d.SetHeartbeatTtl(time.Second))
	}
	require.NoError(t, d.Connect(addr))
	return d
}

// A dialer whose host vanishes (nothing more crosses the link, no FIN)
// must not hold its identity on our ROUTER from its restarted self: the
// ROUTER's own heartbeat reaps the dead connection. The dialer's TTL alone
// does not, whenever its last message was data: libzmq cancels the TTL
// timer on any message and re-arms it only on the next PING.
func TestARestartedPeerIsHeardAfterItsOldLinkDiedSilently(t *testing.T) {
	for _, dataLast := range []bool{false, true} {
		t.Run(fmt.Sprintf("data sent last=%v", dataLast), func(t *testing.T) {
			b := newTestTransport(t, Options{HeartbeatInterval: 200 * time.Millisecond, HeartbeatTimeout: time.Second}) // no TTL, as shipped
			proxy := newTestProxy(t, b.LocalID())
			ctx, err := zmq.NewContext()
			require.NoError(t, err)
			defer ctx.Term()
			id := fmt.Sprintf("127.0.0.1:%d", freePort(t))
			old := foreignDealer(t, ctx, id, "tcp://"+proxy.addr, true)
			_, err = old.SendBytes([]byte("hello"), 0)
			require.NoError(t, err)
			require.Equal(t, []byte("hello"), nextEvent(t, b, 5*time.Second).Frame)
			time.Sleep(1300 * time.Millisecond) // past the old dialer's first PING
			if dataLast {
				_, err = old.SendBytes([]byte("data"), 0)
				require.NoError(t, err)
				require.Equal(t, []byte("data"), nextEvent(t, b, 5*time.Second).Frame)
			}
			proxy.blackhole()
			old.Close()

			start := time.Now()
			for time.Since(start) < 8*time.Second {
				if restartedPeerHeard(t, ctx, b, id) {
					t.Logf("restarted peer heard %v after its old link died", time.Since(start).Round(time.Millisecond))
					return
				}
			}
			t.Fatalf("the restarted peer %s was not heard within 8s: the dead connection still holds its identity", id)
		})
	}
}

// restartedPeerHeard sends one frame from a fresh DEALER under id and
// reports whether it arrived within 400 ms.
func restartedPeerHeard(t *testing.T, ctx *zmq.Context, b *Transport, id string) bool {
	d := foreignDealer(t, ctx, id, "tcp://"+b.LocalID(), false)
	defer d.Close()
	_, err := d.SendBytes([]byte("again"), 0)
	require.NoError(t, err)
	deadline := time.After(400 * time.Millisecond)
	for {
		select {
		case ev := <-b.Events():
			if ev.Kind == control.EventFrame && ev.PeerID == id && string(ev.Frame) == "again" {
				return true
			}
		case <-deadline:
			return false
		}
	}
}

// Under CURVE a member that dials again under its identity while its old
// connection is still up (it restarted before we saw the old link close)
// is heard on the new connection at once: the ROUTER hands the id over.
func TestACurveMemberThatRedialsUnderItsIdentityIsHeardAtOnce(t *testing.T) {
	opts := Options{Curve: curveKeys(t, "cluster secret")}
	b := newTestTransport(t, opts)
	ctx, err := zmq.NewContext()
	require.NoError(t, err)
	defer ctx.Term()
	id := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	dial := func() *zmq.Socket {
		d, err := ctx.NewSocket(zmq.DEALER)
		require.NoError(t, err)
		require.NoError(t, d.SetLinger(0))
		require.NoError(t, d.SetIdentity(id))
		require.NoError(t, secureDealer(d, opts))
		require.NoError(t, d.Connect("tcp://"+b.LocalID()))
		return d
	}
	old := dial()
	defer old.Close()
	_, err = old.SendBytes([]byte("hello"), 0)
	require.NoError(t, err)
	require.Equal(t, []byte("hello"), nextEvent(t, b, 5*time.Second).Frame)

	fresh := dial()
	defer fresh.Close()
	requireHeard(t, b, fresh, id, "again")
}

// requireHeard sends three frames from d (dialed under id) and requires
// that b receives each, in order, from id.
func requireHeard(t *testing.T, b *Transport, d *zmq.Socket, id, text string) {
	t.Helper()
	for i := range 3 {
		frame := fmt.Sprintf("%s %d", text, i)
		_, err := d.SendBytes([]byte(frame), 0)
		require.NoError(t, err)
		ev := nextEvent(t, b, 2*time.Second)
		require.Equal(t, id, ev.PeerID)
		require.Equal(t, frame, string(ev.Frame))
	}
}

// In plaintext anyone can dial under an established peer's id; that must
// not cost the peer its connection: the ROUTER keeps reading the peer's,
// and the impostor's frames are the ones not read.
func TestAPlaintextDialerUnderAnEstablishedPeersIDDoesNotSilenceIt(t *testing.T) {
	b := newTestTransport(t, Options{})
	ctx, err := zmq.NewContext()
	require.NoError(t, err)
	defer ctx.Term()
	id := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	peer := foreignDealer(t, ctx, id, "tcp://"+b.LocalID(), false)
	defer peer.Close()
	_, err = peer.SendBytes([]byte("hello"), 0)
	require.NoError(t, err)
	require.Equal(t, []byte("hello"), nextEvent(t, b, 5*time.Second).Frame)

	impostor := foreignDealer(t, ctx, id, "tcp://"+b.LocalID(), false)
	defer impostor.Close()
	_, err = impostor.SendBytes([]byte("forged"), 0)
	require.NoError(t, err)
	time.Sleep(200 * time.Millisecond) // the impostor's connection is up
	requireHeard(t, b, peer, id, "still here")
}

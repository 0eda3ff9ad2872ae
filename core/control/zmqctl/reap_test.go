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
			b := newTestTransport(t, Options{HeartbeatInterval: 200 * time.Millisecond, HeartbeatTimeout: time.Second, HeartbeatTTL: time.Second})
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

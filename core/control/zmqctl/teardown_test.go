package zmqctl

import (
	"fmt"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// remoteRouter binds a ROUTER in its own context, standing in for a peer
// process, and returns it with its endpoint.
func remoteRouter(t *testing.T) (*zmq.Socket, endpoint) {
	t.Helper()
	ctx, err := zmq.NewContext()
	require.NoError(t, err)
	r, err := newSocket(ctx, zmq.ROUTER)
	require.NoError(t, err)
	ep := endpoint{addr: fmt.Sprintf("tcp://127.0.0.1:%d", freePort(t))}
	require.NoError(t, r.Bind(ep.addr))
	t.Cleanup(func() {
		r.Close()
		_ = ctx.Term()
	})
	return r, ep
}

// awaitHandshake reads pc's monitor until the ZMTP handshake succeeded.
func awaitHandshake(t *testing.T, pc *peerConn, within time.Duration) {
	t.Helper()
	require.NoError(t, pc.monitor.SetRcvtimeo(within))
	event, _, _, err := pc.monitor.RecvEvent(0)
	require.NoError(t, err, "%s: no monitor event within %v", pc.id, within)
	require.Equal(t, zmq.EVENT_HANDSHAKE_SUCCEEDED, event)
}

// Regression: interop runs against vLLM wedged whole transports after a
// rejected connect. A peer dropped its side while we were tearing ours
// down, the DEALER's "disconnected" event found its monitor reader already
// closed, and libzmq's I/O thread blocked forever sending it.
func TestPeerDroppingDuringTeardownLeavesOtherConnectionsWorking(t *testing.T) {
	ctx, err := zmq.NewContext()
	require.NoError(t, err)
	require.NoError(t, ctx.SetBlocky(false))
	defer func() { _ = ctx.Term() }()
	opts, err := Options{}.withDefaults()
	require.NoError(t, err)

	remote, ep := remoteRouter(t)
	pc, err := openPeer(ctx, 1, "local:1", "remote:1", ep, "inproc://teardown-1", opts)
	require.NoError(t, err)
	awaitHandshake(t, pc, 5*time.Second)

	pc.stopWatching()
	// The peer goes away mid-teardown: libzmq raises "disconnected", then
	// "closed" for each refused reconnect (every 100 ms).
	remote.Close()
	time.Sleep(500 * time.Millisecond)
	pc.close(0)

	_, other := remoteRouter(t)
	next, err := openPeer(ctx, 1, "local:1", "remote:2", other, "inproc://teardown-2", opts)
	require.NoError(t, err)
	defer next.close(0)
	awaitHandshake(t, next, 5*time.Second)
}

// Rejecting a peer means dialing it, sending connect + disconnect and
// closing at once, usually before the TCP connection is even up; the
// goodbye must still arrive.
func TestFramesSentRightBeforeDisconnectStillArrive(t *testing.T) {
	a := newTestTransport(t, Options{})
	b := newTestTransport(t, Options{})
	require.NoError(t, a.Send(b.LocalID(), []byte("connect")))
	require.NoError(t, a.Send(b.LocalID(), []byte("disconnect")))
	a.Disconnect(b.LocalID())

	assert.Equal(t, []byte("connect"), nextEvent(t, b, 5*time.Second).Frame)
	assert.Equal(t, []byte("disconnect"), nextEvent(t, b, 5*time.Second).Frame)
	noEvent(t, a, 200*time.Millisecond) // a disconnect on request is not a peer loss
}

func TestDisconnectLingerIsBounded(t *testing.T) {
	silent := silentListener(t) // never completes a handshake
	a := newTestTransport(t, Options{DisconnectLinger: 300 * time.Millisecond})
	require.NoError(t, a.Send(silent, []byte("never delivered")))
	a.Disconnect(silent)
	start := time.Now()
	require.NoError(t, a.Close())
	assert.Less(t, time.Since(start), 3*time.Second, "Close waits for a lingering DEALER at most DisconnectLinger")
}

package zmqctl

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/control"
)

// awaitFrameFrom reads tr's events until a frame from peerID with payload
// want arrives, false after within.
func awaitFrameFrom(tr *Transport, peerID string, want []byte, within time.Duration) bool {
	timer := time.NewTimer(within)
	defer timer.Stop()
	for {
		select {
		case ev, ok := <-tr.Events():
			if !ok {
				return false
			}
			if ev.Kind == control.EventFrame && ev.PeerID == peerID && bytes.Equal(ev.Frame, want) {
				return true
			}
		case <-timer.C:
			return false
		}
	}
}

// Strangers who fill every inbound slot with connections that spoke once
// (and so never expire) cannot lock a legitimate peer out: past
// MaxInboundConns the oldest connection of the most crowded network makes
// room for a newcomer from another one, which stays and is heard.
func TestConnectionsThatStayOpenCannotLockNewcomersOut(t *testing.T) {
	const slots = 8
	b := newTestTransport(t, Options{MaxInboundConns: slots})
	noRedial := func(s *zmq.Socket) error { return s.SetReconnectIvl(time.Minute) }
	for i := range slots {
		// "source;destination": one network, 127.0.1.0/24, many addresses.
		id := fmt.Sprintf("127.0.1.%d:1", i+1)
		s := newRawDealer(t, id, fmt.Sprintf("127.0.1.%d:0;%s", i+1, b.LocalID()), noRedial)
		_, err := s.sock.SendBytes([]byte("junk"), 0)
		require.NoError(t, err)
		require.True(t, awaitFrameFrom(b, id, []byte("junk"), 10*time.Second), "stranger %d heard", i)
	}
	require.Equal(t, int64(slots), b.Stats().InboundConns)

	legit := newRawDealer(t, "127.0.0.1:2", b.LocalID(), noRedial)
	require.True(t, legit.awaitEvent(zmq.EVENT_CONNECTED, 5*time.Second))
	_, err := legit.sock.SendBytes([]byte("one"), 0)
	require.NoError(t, err)
	assert.True(t, awaitFrameFrom(b, "127.0.0.1:2", []byte("one"), 10*time.Second), "the newcomer's first frame")
	assert.False(t, legit.awaitEvent(zmq.EVENT_DISCONNECTED, time.Second), "the newcomer was shut")
	_, err = legit.sock.SendBytes([]byte("two"), 0)
	require.NoError(t, err)
	assert.True(t, awaitFrameFrom(b, "127.0.0.1:2", []byte("two"), 10*time.Second), "the newcomer's second frame")
	st := b.Stats()
	t.Logf("stats %+v", st)
	assert.Equal(t, uint64(1), st.InboundShut, "one stranger made room")
}

// Connections per network are bounded as per address: one host's many
// addresses (here 127.0.1.0/24) cannot take more than its network's share.
func TestInboundConnectionsPerNetworkAreBounded(t *testing.T) {
	const perNet, dialers = 3, 5
	b := newTestTransport(t, Options{MaxInboundConnsPerNetwork: perNet, UnheardTimeout: time.Minute})
	var wg sync.WaitGroup
	dropped := make([]bool, dialers)
	for i := range dialers {
		d := newRawDealer(t, fmt.Sprintf("net-%d", i), fmt.Sprintf("127.0.1.%d:0;%s", i+1, b.LocalID()),
			func(s *zmq.Socket) error { return s.SetReconnectIvl(time.Minute) })
		require.True(t, d.awaitEvent(zmq.EVENT_CONNECTED, 5*time.Second), "dialer %d", i)
		wg.Add(1)
		go func() {
			defer wg.Done()
			dropped[i] = d.awaitEvent(zmq.EVENT_DISCONNECTED, 3*time.Second)
		}()
	}
	wg.Wait()
	shut := 0
	for _, d := range dropped {
		if d {
			shut++
		}
	}
	assert.Equal(t, dialers-perNet, shut, "connections over the per-network bound")
	// The shut connections' ends reach the pump's counts a moment later.
	assert.Eventually(t, func() bool { return b.Stats().InboundConns == int64(perNet) }, 5*time.Second, 10*time.Millisecond)
	t.Logf("dropped %v; stats %+v", dropped, b.Stats())
}

// Peers that never read keep what waits for all peers at its bound: a
// peer that reads still gets every frame (the total bound refuses only a
// peer over its share), so it is not reported down for others' backlog.
func TestPeersThatNeverReadCannotStarveOneThatReads(t *testing.T) {
	const frameSize = 16 << 10
	a := newTestTransport(t, Options{SendQueueBytes: 1 * mib, TotalSendQueueBytes: 3 * mib, SendTimeout: time.Minute})
	frame := make([]byte, frameSize)
	full := int64(3*mib - 2*frameCost(frame))
	silent := make([]string, 4)
	for i := range silent {
		_, silent[i] = fakePeer(t, true)
	}
	// Top their queues up until libzmq and TCP take no more from them.
	var queued int64
	for end := time.Now().Add(20 * time.Second); queued <= full && time.Now().Before(end); {
		for _, peer := range silent {
			for range 1000 {
				if err := a.Send(peer, frame); err != nil {
					require.ErrorIs(t, err, ErrSendQueueFull)
					break
				}
			}
		}
		time.Sleep(200 * time.Millisecond)
		queued = a.Stats().QueuedSendBytes
	}
	t.Logf("waiting for the silent peers: %d bytes", queued)
	require.Greater(t, queued, full, "the total is not full")

	reader := newTestTransport(t, Options{})
	for i := range 200 {
		frame[0], frame[1] = byte(i), byte(i>>8)
		require.NoError(t, a.Send(reader.LocalID(), frame), "send %d to the reading peer", i)
		require.True(t, awaitFrameFrom(reader, a.LocalID(), frame, 10*time.Second), "frame %d", i)
	}
}

// Our descriptor of each inbound connection is closed when it ends:
// connections coming and going leave no descriptor behind.
func TestInboundConnectionsLeaveNoDescriptorBehind(t *testing.T) {
	b := newTestTransport(t, Options{})
	openFds := func() int {
		entries, err := os.ReadDir("/proc/self/fd")
		require.NoError(t, err)
		return len(entries)
	}
	before := openFds()
	conns := make([]net.Conn, 50)
	for i := range conns {
		c, err := net.Dial("tcp", b.LocalID())
		require.NoError(t, err)
		conns[i] = c
	}
	require.Eventually(t, func() bool { return b.Stats().InboundConns == int64(len(conns)) },
		10*time.Second, 10*time.Millisecond)
	for _, c := range conns {
		require.NoError(t, c.Close())
	}
	require.Eventually(t, func() bool { return b.Stats().InboundConns == 0 }, 10*time.Second, 10*time.Millisecond)
	assert.Eventually(t, func() bool { return openFds() <= before }, 5*time.Second, 10*time.Millisecond,
		"descriptors before %d, after %d", before, openFds())
}

// A ROUTER kept busy (here a consumer that stopped taking events) never
// drains, so unheard connections cannot wait for a drain to expire: one
// that never speaks is shut within four UnheardTimeouts regardless.
func TestSilentConnectionsAreShutEvenWhileTheRouterIsBusy(t *testing.T) {
	const unheard = 250 * time.Millisecond
	b := newTestTransport(t, Options{EventBuffer: 1, UnheardTimeout: unheard})
	busy := newRawDealer(t, "busy", b.LocalID())
	for range 4 { // nobody reads b's events: these stay in front of the consumer
		_, err := busy.sock.SendBytes([]byte("unread"), 0)
		require.NoError(t, err)
	}
	require.Eventually(t, func() bool { return b.Stats().FramesIn >= 2 }, 10*time.Second, 10*time.Millisecond)
	silent := newRawDealer(t, "silent", b.LocalID(), func(s *zmq.Socket) error { return s.SetReconnectIvl(time.Minute) })
	require.True(t, silent.awaitEvent(zmq.EVENT_CONNECTED, 5*time.Second))
	assert.True(t, silent.awaitEvent(zmq.EVENT_DISCONNECTED, 4*unheard+5*time.Second), "the silent connection stays open")
	t.Logf("stats %+v", b.Stats())
}

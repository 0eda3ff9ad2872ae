package zmqctl

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/control"
)

// Transports of one process share libzmq's I/O thread; what happens to one
// must not hold up another. A blocked I/O thread never recovers, so the
// bounds here are loose (a loaded 2-core box) and a failure is a timeout.
const roundTripBound = 2 * time.Second

// echo answers every frame c receives until c closes.
func echo(c *Transport) {
	go func() {
		for ev := range c.Events() {
			if ev.Kind == control.EventFrame {
				_ = c.Send(ev.PeerID, ev.Frame)
			}
		}
	}()
}

// pinger sends numbered frames from b to the echo and times each answer.
type pinger struct {
	b, echo *Transport
	n       int
	slowest time.Duration
}

func (p *pinger) roundTrip(t *testing.T) {
	t.Helper()
	p.n++
	frame := fmt.Appendf(nil, "ping %d", p.n)
	start := time.Now()
	require.NoError(t, p.b.Send(p.echo.LocalID(), frame))
	ev := nextEvent(t, p.b, 5*time.Second)
	require.Equal(t, control.EventFrame, ev.Kind, "%+v", ev)
	require.Equal(t, frame, ev.Frame)
	p.slowest = max(p.slowest, time.Since(start))
}

// pingFor keeps round trips going for d.
func (p *pinger) pingFor(t *testing.T, d time.Duration) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); {
		p.roundTrip(t)
	}
}

func TestClosingOneTransportLeavesTheOthersWorking(t *testing.T) {
	a := newTestTransport(t, Options{})
	b := newTestTransport(t, Options{})
	c := newTestTransport(t, Options{})
	echo(c)
	// a and c hold DEALERs to each other, so closing a drops connections
	// both ways while b keeps talking to c.
	require.NoError(t, a.Send(c.LocalID(), []byte("from a")))
	require.Equal(t, []byte("from a"), nextEvent(t, a, 5*time.Second).Frame)
	p := &pinger{b: b, echo: c}
	p.pingFor(t, 100*time.Millisecond)

	closed := make(chan error, 1)
	go func() { closed <- a.Close() }()
	p.pingFor(t, 300*time.Millisecond)
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("a.Close did not return")
	}
	p.pingFor(t, 100*time.Millisecond)

	d := newTestTransport(t, Options{})
	exchange(t, b, d) // a new handshake after the close
	t.Logf("%d round trips, slowest %v", p.n, p.slowest)
	assert.Less(t, p.slowest, roundTripBound)
}

// fakePeer is a bare ROUTER in its own context, standing in for a peer
// process. A stalling one takes one message and then stops reading TCP,
// with a small kernel buffer, like a peer whose process hangs.
func fakePeer(t *testing.T, stalling bool) (*zmq.Socket, string) {
	t.Helper()
	ctx, err := zmq.NewContext()
	require.NoError(t, err)
	r, err := newSocket(ctx, zmq.ROUTER)
	require.NoError(t, err)
	if stalling {
		require.NoError(t, r.SetRcvhwm(1))
		require.NoError(t, r.SetRcvbuf(16<<10))
	}
	peerID := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	require.NoError(t, r.Bind("tcp://"+peerID))
	t.Cleanup(func() {
		r.Close() // a no-op if the test closed it
		_ = ctx.Term()
	})
	return r, peerID
}

func TestDeadAndStalledPeersOfOneTransportDoNotDelayAnother(t *testing.T) {
	a := newTestTransport(t, Options{SendHWM: 4, SendTimeout: 500 * time.Millisecond})
	b := newTestTransport(t, Options{})
	c := newTestTransport(t, Options{})
	echo(c)
	p := &pinger{b: b, echo: c}
	p.roundTrip(t)

	// Stalled: a ZMTP peer that stops reading, so a's TCP send buffer and
	// libzmq queue fill up until SendTimeout reports it down.
	_, stalled := fakePeer(t, true)
	big := bytes.Repeat([]byte{'x'}, 1<<20)
	for sent := 0; ; sent++ {
		err := a.Send(stalled, big)
		if errors.Is(err, ErrSendQueueFull) {
			break
		}
		require.NoError(t, err)
		require.Less(t, sent, 64, "the stalled peer's queue never filled")
		if sent%4 == 3 {
			p.roundTrip(t) // gives the pump a turn to hand frames to libzmq
		}
	}
	// Killed: a peer whose process is gone; a's DEALER raises disconnected,
	// then closed for every refused reconnect.
	killed, killedID := fakePeer(t, false)
	require.NoError(t, a.Send(killedID, []byte("hello")))
	p.pingFor(t, 200*time.Millisecond)
	killed.Close()

	down := map[string]bool{}
	for end := time.Now().Add(10 * time.Second); len(down) < 2 && time.Now().Before(end); {
		select {
		case ev := <-a.Events():
			if ev.Kind == control.EventPeerDown {
				down[ev.PeerID] = true
			}
		default:
			p.roundTrip(t)
		}
	}
	assert.True(t, down[stalled], "the stalled peer is reported down")
	assert.True(t, down[killedID], "the killed peer is reported down")

	// A peer dying while its Transport tears down (see
	// TestPeerDroppingDuringTeardownLeavesOtherConnectionsWorking).
	dying, dyingID := fakePeer(t, false)
	require.NoError(t, a.Connect(dyingID))
	p.pingFor(t, 100*time.Millisecond)
	died := make(chan struct{})
	go func() { dying.Close(); close(died) }()
	require.NoError(t, a.Close())
	select {
	case <-died:
	case <-time.After(5 * time.Second):
		t.Fatal("closing the dying peer's socket did not return")
	}
	p.pingFor(t, 300*time.Millisecond)

	d := newTestTransport(t, Options{})
	exchange(t, b, d)
	t.Logf("%d round trips, slowest %v", p.n, p.slowest)
	assert.Less(t, p.slowest, roundTripBound)
}

package zmqctl

import (
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/control"
)

// zmqContexts counts the libzmq contexts alive in this process: each runs
// one reaper thread, named "ZMQbg/Reaper" (set by the thread itself, so a
// context is counted a moment after its first socket).
func zmqContexts(t testing.TB) int {
	t.Helper()
	tasks, err := os.ReadDir("/proc/self/task")
	require.NoError(t, err)
	n := 0
	for _, task := range tasks {
		comm, err := os.ReadFile("/proc/self/task/" + task.Name() + "/comm")
		if err == nil && strings.TrimSpace(string(comm)) == "ZMQbg/Reaper" {
			n++
		}
	}
	return n
}

// requireContexts waits for exactly want contexts; a thread that was
// joined can stay listed for a moment.
func requireContexts(t testing.TB, want int, why string) {
	t.Helper()
	require.Eventually(t, func() bool { return zmqContexts(t) == want }, 5*time.Second, 5*time.Millisecond,
		"%s: want %d ZMQ contexts, have %d", why, want, zmqContexts(t))
}

func openFDs(t testing.TB) int {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	require.NoError(t, err)
	return len(fds)
}

// exchange sends a frame each way and waits for both.
func exchange(t testing.TB, a, b *Transport) {
	t.Helper()
	require.NoError(t, a.Send(b.LocalID(), []byte("to "+b.LocalID())))
	require.Equal(t, []byte("to "+b.LocalID()), nextFrame(t, b))
	require.NoError(t, b.Send(a.LocalID(), []byte("to "+a.LocalID())))
	require.Equal(t, []byte("to "+a.LocalID()), nextFrame(t, a))
}

// nextFrame skips the loss of peers closed earlier in a test.
func nextFrame(t testing.TB, tr *Transport) []byte {
	t.Helper()
	for {
		ev := nextEvent(t, tr, 5*time.Second)
		if ev.Kind == control.EventFrame {
			return ev.Frame
		}
		require.Equal(t, control.EventPeerDown, ev.Kind, "%+v", ev)
	}
}

func TestTransportsOfAProcessShareOneContext(t *testing.T) {
	requireContexts(t, 0, "before the test")
	a := newTestTransport(t, Options{})
	b := newTestTransport(t, Options{})
	exchange(t, a, b)
	requireContexts(t, 1, "two open transports")
	time.Sleep(50 * time.Millisecond) // a second context would be named by now
	assert.Equal(t, 1, zmqContexts(t), "two open transports")

	require.NoError(t, a.Close())
	assert.Equal(t, 1, zmqContexts(t), "b still holds the context")
	require.NoError(t, b.Close())
	requireContexts(t, 0, "every transport closed")

	c := newTestTransport(t, Options{})
	d := newTestTransport(t, Options{})
	exchange(t, c, d) // a fresh context after the last one ended
	requireContexts(t, 1, "transports opened again")
}

// A restarted peer binds its port again in the same process: Close frees
// it although the context lives on.
func TestClosedTransportsPortIsFreeAtOnce(t *testing.T) {
	keeper := newTestTransport(t, Options{}) // holds the shared context
	for range 20 {
		a := newTestTransport(t, Options{})
		port := portOf(t, a.LocalID())
		require.NoError(t, a.Close())
		again, err := New(a.LocalID(), "127.0.0.1", port, Options{Logger: quietLogger})
		require.NoError(t, err, "port %d still held after Close", port)
		t.Cleanup(func() { _ = again.Close() })
		exchange(t, keeper, again)
		require.NoError(t, again.Close())
	}
}

// openLoopback is newTestTransport for goroutines other than the test's.
func openLoopback(opts Options) (*Transport, error) {
	opts.Logger = quietLogger
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		tr, err := New(fmt.Sprintf("127.0.0.1:%d", port), "127.0.0.1", port, opts)
		if err != nil && strings.Contains(err.Error(), "in use") {
			continue
		}
		return tr, err
	}
	return nil, errors.New("no free loopback port after 20 tries")
}

// awaitFrame waits for one frame, bounded, off the test's goroutine.
func awaitFrame(tr *Transport, within time.Duration) ([]byte, error) {
	timer := time.NewTimer(within)
	defer timer.Stop()
	select {
	case ev, ok := <-tr.Events():
		if !ok || ev.Kind != control.EventFrame {
			return nil, fmt.Errorf("%s: want a frame, got %+v (open %v)", tr.LocalID(), ev, ok)
		}
		return ev.Frame, nil
	case <-timer.C:
		return nil, fmt.Errorf("%s: no frame within %v", tr.LocalID(), within)
	}
}

// openExchanging opens two transports and sends a frame from one to the
// other; with lingering, the answer's DEALER is closed by Disconnect and
// lingers. What it opened is in the returned slice even on error.
func openExchanging(lingering bool) ([]*Transport, error) {
	opts := Options{DisconnectLinger: 50 * time.Millisecond, CloseTimeout: 10 * time.Second}
	var opened []*Transport
	for range 2 {
		tr, err := openLoopback(opts)
		if err != nil {
			return opened, err
		}
		opened = append(opened, tr)
	}
	x, y := opened[0], opened[1]
	if err := x.Send(y.LocalID(), []byte("hello")); err != nil {
		return opened, err
	}
	if _, err := awaitFrame(y, 10*time.Second); err != nil {
		return opened, err
	}
	if lingering {
		if err := y.Send(x.LocalID(), []byte("goodbye")); err != nil {
			return opened, err
		}
		y.Disconnect(x.LocalID())
	}
	return opened, nil
}

// arriveAndWait is a bounded barrier: the caller counts itself in, then
// waits for the others.
func arriveAndWait(wg *sync.WaitGroup, within time.Duration) error {
	wg.Done()
	all := make(chan struct{})
	go func() { wg.Wait(); close(all) }()
	select {
	case <-all:
		return nil
	case <-time.After(within):
		return fmt.Errorf("the other workers did not arrive within %v", within)
	}
}

// Transports open and close concurrently: the workers close together,
// some opening again while others still close, and every other round all
// wait until everything is closed, so the context ends and the next round
// starts a fresh one. Each New must get a live context; nothing may be
// left behind.
func TestConcurrentOpenCloseChurnLeavesNothing(t *testing.T) {
	requireContexts(t, 0, "before the test")
	freePort(t) // the runtime's netpoller descriptors exist from here on
	fdsBefore := openFDs(t)

	const workers, rounds = 6, 8
	closeTogether := make([]sync.WaitGroup, rounds)
	allClosed := make([]sync.WaitGroup, rounds)
	for r := range rounds {
		closeTogether[r].Add(workers)
		allClosed[r].Add(workers)
	}
	var wg sync.WaitGroup
	errs := make(chan error, workers*rounds)
	for w := range workers {
		wg.Go(func() {
			for r := range rounds { // every round, even after a failure, so no one waits for us in vain
				opened, err := openExchanging((w+r)%2 == 0)
				err = errors.Join(err, arriveAndWait(&closeTogether[r], 30*time.Second))
				for _, tr := range opened {
					err = errors.Join(err, tr.Close())
				}
				if r%2 == 1 {
					err = errors.Join(err, arriveAndWait(&allClosed[r], 30*time.Second))
				}
				if err != nil {
					errs <- fmt.Errorf("worker %d round %d: %w", w, r, err)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	requireContexts(t, 0, "every transport closed")
	require.Eventually(t, func() bool { return openFDs(t) <= fdsBefore }, 5*time.Second, 10*time.Millisecond,
		"descriptors: %d before, %d after", fdsBefore, openFDs(t))
}

func TestSharedContextIsCreatedAgainAfterTheLastRelease(t *testing.T) {
	var s sharedContext
	first, err := s.acquire(0)
	require.NoError(t, err)
	second, err := s.acquire(time.Second)
	require.NoError(t, err)
	require.Same(t, first, second, "one context while it is held")
	assert.Equal(t, time.Second, s.lingerBound())
	require.NoError(t, s.release(first))
	require.NoError(t, s.release(second))
	assert.Error(t, s.release(second), "released once too often")

	fresh, err := s.acquire(0)
	require.NoError(t, err)
	assert.NotSame(t, first, fresh, "the terminated context is never handed out")
	sock, err := newSocket(fresh, zmq.PAIR)
	require.NoError(t, err, "the fresh context works")
	sock.Close()
	require.NoError(t, s.release(fresh))
}

// The count drops to zero over and over while other goroutines acquire:
// none may be handed the context being terminated.
func TestSharedContextAcquireRacingTermGetsALiveContext(t *testing.T) {
	var s sharedContext
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			for range 100 {
				ctx, err := s.acquire(0)
				if err == nil {
					var sock *zmq.Socket
					if sock, err = newSocket(ctx, zmq.PAIR); err == nil {
						sock.Close()
					}
					err = errors.Join(err, s.release(ctx))
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assert.Nil(t, s.ctx, "terminated after the last release")
}

func TestForkedChildDoesNotUseTheParentsContext(t *testing.T) {
	var s sharedContext
	ctx, err := s.acquire(0)
	require.NoError(t, err)
	s.pid++ // what a forked child sees: the context was made by another process
	_, err = s.acquire(0)
	assert.ErrorIs(t, err, errForkedChild)
	s.pid--
	require.NoError(t, s.release(ctx))
}

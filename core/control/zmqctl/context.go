package zmqctl

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// maxSockets is ZMQ_MAX_SOCKETS of the shared context. A peer link costs
// its Transport three sockets (the DEALER, the monitor's reader and
// libzmq's own end of the monitor) and all Transports of a process now
// count against one context: libzmq's default (1023) would cap a process
// at ~340 links, fewer than the 8 × 63 of the 64-peer scale bench. 65535
// is libzmq's own socket limit on Linux; its slot table costs ~0.8 MiB,
// once per process.
const maxSockets = 1<<16 - 1

// ioThreads is ZMQ_IO_THREADS of the shared context. libzmq cancels a
// connection's heartbeat timers (on the message after each ping) with a
// walk over all timers of its I/O thread, so with every peer of a process
// in one context that walk grows with the process's connections. In the
// 64-peer scale bench (8 peers a process, interleaved runs) four threads
// matched a context per peer (1828-3429 lookups/s against 1975-2584); two
// were 1.5x slower, eight no faster.
const ioThreads = 4

// errForkedChild refuses a child that would use its parent's context:
// libzmq's threads did not survive the fork, so the context is dead there.
var errForkedChild = errors.New("zmqctl: forked child")

// sharedContext is the one ZMQ context every Transport of the process
// uses: ioThreads I/O threads and one reaper thread instead of an I/O
// and a reaper thread per peer.
// New acquires it (creating it on first use) and the pump releases it once
// its sockets are closed; the last release terminates it, so a process
// with no Transport runs no libzmq thread, and the next acquire creates a
// fresh one.
type sharedContext struct {
	mu    sync.Mutex
	ctx   *zmq.Context // nil before the first acquire and after the last release
	users int          // Transports holding ctx; Term runs only at zero
	pid   int          // the process that created ctx
	// longestLinger is the longest DisconnectLinger of ctx's users: a
	// DEALER closed by Disconnect outlives its Transport in the shared
	// context, and the last release's Term waits for it.
	longestLinger time.Duration
}

// processContext is the process's shared context.
var processContext sharedContext

// acquire returns the shared context, creating it if there is none.
// disconnectLinger is the caller's Options.DisconnectLinger.
func (s *sharedContext) acquire(disconnectLinger time.Duration) (*zmq.Context, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx != nil && s.pid != os.Getpid() {
		return nil, fmt.Errorf("%w: the ZMQ context belongs to pid %d, this is pid %d; create transports after fork",
			errForkedChild, s.pid, os.Getpid())
	}
	if s.ctx == nil {
		ctx, err := newProcessContext()
		if err != nil {
			return nil, err
		}
		s.ctx, s.pid, s.longestLinger = ctx, os.Getpid(), 0
	}
	s.users++
	s.longestLinger = max(s.longestLinger, disconnectLinger)
	return s.ctx, nil
}

// release gives back a context from acquire; the caller has closed every
// socket it made in it, or Term would wait for them forever. The last
// release terminates the context outside the lock: Term waits for DEALERs
// still lingering, and an acquire meanwhile gets a fresh context.
func (s *sharedContext) release(ctx *zmq.Context) error {
	s.mu.Lock()
	if ctx != s.ctx || s.users == 0 {
		s.mu.Unlock()
		return errors.New("zmqctl: released a ZMQ context that is not held")
	}
	s.users--
	if s.users > 0 {
		s.mu.Unlock()
		return nil
	}
	forked := s.pid != os.Getpid()
	s.ctx = nil
	s.mu.Unlock()
	if forked {
		return nil // the parent's libzmq threads are not here to finish a Term
	}
	if err := ctx.Term(); err != nil {
		return fmt.Errorf("zmq context term: %w", err)
	}
	return nil
}

// lingerBound is how long the last release's Term may wait for DEALERs
// that Transports parked by Disconnect and closed at Close, at most.
func (s *sharedContext) lingerBound() time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.longestLinger
}

// newProcessContext sets what every user of the context relies on; both
// options apply only to sockets created later, so they are set first.
func newProcessContext() (*zmq.Context, error) {
	ctx, err := zmq.NewContext()
	if err != nil {
		return nil, fmt.Errorf("new zmq context: %w", err)
	}
	// Sockets made by libzmq itself (monitors) get linger 0 too: one closed
	// with events unread would otherwise hold Term forever.
	if err := ctx.SetBlocky(false); err != nil {
		_ = ctx.Term()
		return nil, fmt.Errorf("set context blocky: %w", err)
	}
	if err := ctx.SetIoThreads(ioThreads); err != nil {
		_ = ctx.Term()
		return nil, fmt.Errorf("set context I/O threads: %w", err)
	}
	if err := ctx.SetMaxSockets(maxSockets); err != nil {
		_ = ctx.Term()
		return nil, fmt.Errorf("set context max sockets: %w", err)
	}
	return ctx, nil
}

// transportSeq hands each Transport its I/O thread.
var transportSeq atomic.Uint64

// nextAffinity is the ZMQ_AFFINITY of a new Transport's network sockets:
// one I/O thread of the shared context, in turn. A Transport's connections
// then stay on one thread, as with a context of its own, so libzmq handles
// them in order: a DEALER closed and dialed again under the same identity
// (after a refusal, a restart) reaches the remote ROUTER after its old
// connection is gone, not racing it on another thread (the ROUTER refuses
// an identity it still holds).
func nextAffinity() uint64 {
	return 1 << ((transportSeq.Add(1) - 1) % ioThreads)
}

// monitorSeq numbers monitor endpoints process-wide: inproc names live in
// the shared context, and libzmq frees them asynchronously, so a name is
// never used twice.
var monitorSeq atomic.Uint64

func nextMonitorAddr() string {
	return fmt.Sprintf("inproc://peerkv-zmqctl-monitor-%d", monitorSeq.Add(1))
}

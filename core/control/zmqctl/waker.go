package zmqctl

import (
	"encoding/binary"
	"fmt"
	"sync"
	"sync/atomic"

	zmq "github.com/pebbe/zmq4"
	"golang.org/x/sys/unix"
)

// waker lets any goroutine interrupt the pump's wait: an eventfd the
// pump watches, written by whoever queued a command. pending coalesces
// wake-ups so a burst of commands costs one write; mu keeps a write from
// racing with close (a closed fd number may be reused).
type waker struct {
	pending atomic.Bool

	mu sync.Mutex
	fd int // -1 once closed
}

func newWaker() (*waker, error) {
	fd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("eventfd: %w", err)
	}
	return &waker{fd: fd}, nil
}

var wakeOne = binary.NativeEndian.AppendUint64(nil, 1)

// wake interrupts the pump's wait unless a wake-up is already pending.
func (w *waker) wake() {
	if !w.pending.CompareAndSwap(false, true) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fd >= 0 {
		// EAGAIN (counter saturated) already guarantees a wake-up.
		_, _ = unix.Write(w.fd, wakeOne)
	}
}

// drain resets the eventfd; the pump calls it when the fd polled readable.
func (w *waker) drain() {
	var buf [8]byte
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fd >= 0 {
		_, _ = unix.Read(w.fd, buf[:])
	}
}

// consumed is called by the pump after draining the eventfd and before
// reading the command queue, so no command can miss its wake-up.
func (w *waker) consumed() { w.pending.Store(false) }

func (w *waker) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fd >= 0 {
		_ = unix.Close(w.fd)
		w.fd = -1
	}
}

// newSocket opens a socket with linger 0, so closing it never waits for
// unsent messages and the context terminates at once.
func newSocket(ctx *zmq.Context, kind zmq.Type) (*zmq.Socket, error) {
	sock, err := ctx.NewSocket(kind)
	if err != nil {
		return nil, fmt.Errorf("new %v socket: %w", kind, err)
	}
	if err := sock.SetLinger(0); err != nil {
		sock.Close()
		return nil, fmt.Errorf("set linger on %v socket: %w", kind, err)
	}
	return sock, nil
}

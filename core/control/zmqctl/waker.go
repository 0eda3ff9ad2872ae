package zmqctl

import (
	"fmt"
	"sync"
	"sync/atomic"

	zmq "github.com/pebbe/zmq4"
)

// waker lets any goroutine interrupt the pump's zmq_poll. The sending PAIR
// is shared under a mutex (libzmq allows a socket to move between threads
// with a full memory barrier); pending coalesces wake-ups so a burst of
// Sends costs one inproc message.
type waker struct {
	pending atomic.Bool

	mu   sync.Mutex
	send *zmq.Socket // nil once closed
}

// newWaker returns the waker and the receiving socket the pump polls.
func newWaker(ctx *zmq.Context, addr string) (*waker, *zmq.Socket, error) {
	recv, err := newSocket(ctx, zmq.PAIR)
	if err != nil {
		return nil, nil, err
	}
	if err := recv.Bind(addr); err != nil {
		recv.Close()
		return nil, nil, fmt.Errorf("bind %s: %w", addr, err)
	}
	send, err := newSocket(ctx, zmq.PAIR)
	if err != nil {
		recv.Close()
		return nil, nil, err
	}
	if err := send.Connect(addr); err != nil {
		send.Close()
		recv.Close()
		return nil, nil, fmt.Errorf("connect %s: %w", addr, err)
	}
	return &waker{send: send}, recv, nil
}

// wake interrupts the pump's poll unless a wake-up is already pending.
func (w *waker) wake() {
	if !w.pending.CompareAndSwap(false, true) {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.send != nil {
		// DONTWAIT: a full pipe already guarantees a wake-up.
		_, _ = w.send.SendBytes([]byte{1}, zmq.DONTWAIT)
	}
}

// consumed is called by the pump after draining the receiving socket and
// before reading the command queue, so no command can miss its wake-up.
func (w *waker) consumed() { w.pending.Store(false) }

func (w *waker) close() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.send != nil {
		w.send.Close()
		w.send = nil
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

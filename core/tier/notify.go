package tier

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"

	"golang.org/x/sys/unix"
)

// notifier owns the host notification fd (peerkv_notify_fd): an eventfd the
// tier makes readable whenever something appears that the host must collect
// with a call (an inbound item, a job result, changed lookup answers) and
// once when the peer stops.
// The host only reads and polls it; the tier alone writes and closes it.
//
// It is opened lazily, on the host's first request, so hosts that never ask
// hold no extra fd and peer creation cannot fail for a feature nobody uses;
// the caller (NotifyFD) signals at once when items were queued before then.
//
// signal and Close take mu, so a signal after (or racing) Close is a no-op
// and never writes to a closed, perhaps reused, fd number.
type notifier struct {
	mu     sync.Mutex
	fd     int // valid when open
	open   bool
	closed bool
}

// get returns the fd, creating it on the first call; created says this
// call made it. After Close it fails with ErrClosed.
func (n *notifier) get() (fd int, created bool, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.closed {
		return -1, false, fmt.Errorf("%w: the notification fd was closed with the handle", ErrClosed)
	}
	if n.open {
		return n.fd, false, nil
	}
	fd, err = unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC)
	if err != nil {
		return -1, false, fmt.Errorf("eventfd: %w", err)
	}
	n.fd, n.open = fd, true
	return fd, true, nil
}

// eventfdIncrement is what signal writes: add 1 to the counter.
var eventfdIncrement = binary.NativeEndian.AppendUint64(nil, 1)

// signal makes the fd readable (the eventfd counter coalesces). It never
// blocks: EAGAIN means the counter is full, hence readable already. Without
// an open fd (never asked for, or closed) it does nothing.
func (n *notifier) signal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	if !n.open {
		return
	}
	for {
		_, err := unix.Write(n.fd, eventfdIncrement)
		if !errors.Is(err, unix.EINTR) {
			return
		}
	}
}

// Close closes the fd (if it was ever opened); later signals are no-ops and
// later gets fail. Idempotent.
func (n *notifier) Close() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closed = true
	if !n.open {
		return nil
	}
	n.open = false
	return unix.Close(n.fd)
}

// NotifyFD returns the host notification eventfd (see peerkv_notify_fd),
// opening it on the first call. Items queued before that call, and a peer
// already stopped, make it readable at once, so nothing queued earlier is
// missed. It stays valid after Shutdown, until CloseNotify.
func (t *Tier) NotifyFD() (int, error) {
	t.mu.Lock()
	defer t.unlockHost()
	fd, created, err := t.host.notify.get()
	if err != nil {
		return -1, err
	}
	if created && (t.ledger.unreported() > 0 || t.desk.inboundQueued() > 0 || t.life.closed) {
		t.host.notify.signal()
	}
	return fd, nil
}

// CloseNotify closes the notification fd; capi calls it from peerkv_destroy,
// after Shutdown. Idempotent; NotifyFD fails afterwards.
func (t *Tier) CloseNotify() error { return t.host.notify.Close() }

package rowsum

import (
	"fmt"
	"sync"

	"github.com/peerkv/peerkv/core/data"
)

// Writer starts a transport's writes, summing the source rows of those
// that ask for it first, off the caller's thread (the caller may be the
// host's scheduler thread): the sums cover what the rows held when the
// send began, so a row changed while its transfer runs fails the check.
// It numbers transfers itself; read completions from Writer, not from the
// transport.
type Writer struct {
	inner  data.Transport
	region data.Region
	outbox *data.Outbox

	mu      sync.Mutex
	next    uint64
	started map[uint64]started // the transport's id -> ours
	closed  bool
	summing sync.WaitGroup

	// beforeSend, if set (tests), runs after a summed write's sums and
	// before its transfer starts.
	beforeSend func(peerID string, src []uint64)
}

type started struct {
	id   uint64
	sums []uint32
}

// NewWriter wraps inner, whose local rows are region's.
func NewWriter(inner data.Transport, region data.Region) *Writer {
	w := &Writer{inner: inner, region: region, outbox: data.NewOutbox(1024), started: map[uint64]started{}}
	go w.forward()
	return w
}

// Write starts a transfer as the transport would, without sums.
func (w *Writer) Write(peerID string, src, dst []uint64) (uint64, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return 0, data.ErrClosed
	}
	innerID, err := w.inner.Write(peerID, src, dst)
	if err != nil {
		return 0, err
	}
	w.next++
	w.started[innerID] = started{id: w.next}
	return w.next, nil
}

// WriteSummed starts a transfer whose completion carries the CRC-32C of
// each source row (Completion.Sums): the rows are summed on a goroutine of
// their own, then the transfer starts. Failures after it returned arrive as
// its completion.
func (w *Writer) WriteSummed(peerID string, src, dst []uint64) (uint64, error) {
	rows := w.region.NumRows()
	for _, r := range src {
		if r >= rows {
			return 0, fmt.Errorf("%w: source row %d of %d", data.ErrRowOutOfRange, r, rows)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return 0, data.ErrClosed
	}
	w.next++
	id := w.next
	hook := w.beforeSend
	w.summing.Add(1)
	go func() {
		defer w.summing.Done()
		sums := Rows(w.region, src)
		if hook != nil {
			hook(peerID, src)
		}
		if err := w.start(peerID, src, dst, started{id: id, sums: sums}); err != nil {
			w.outbox.Send(data.Completion{PeerID: peerID, ID: id, Err: err})
		}
	}()
	return id, nil
}

// start starts the transfer of a summed write, unless Writer closed.
func (w *Writer) start(peerID string, src, dst []uint64, s started) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return data.ErrClosed
	}
	innerID, err := w.inner.Write(peerID, src, dst)
	if err == nil {
		w.started[innerID] = s
	}
	return err
}

// SetBeforeSend makes every later summed write call f after its sums and
// before its transfer starts: tests change a source row there.
func (w *Writer) SetBeforeSend(f func(peerID string, src []uint64)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.beforeSend = f
}

// Completions delivers each transfer's outcome once, under Writer's ids.
func (w *Writer) Completions() <-chan data.Completion { return w.outbox.C() }

// forward relabels the transport's completions until it closes them.
func (w *Writer) forward() {
	for c := range w.inner.Completions() {
		w.mu.Lock()
		s, ok := w.started[c.ID]
		delete(w.started, c.ID)
		w.mu.Unlock()
		if !ok {
			continue // not started through Writer
		}
		c.ID = s.id
		if c.Err == nil {
			c.Sums = s.sums
		}
		w.outbox.Send(c)
	}
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.summing.Wait()
	w.outbox.Finish()
}

// Close closes the transport; writes still summing complete as failed.
func (w *Writer) Close() error {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.outbox.StartClosing()
	return w.inner.Close()
}

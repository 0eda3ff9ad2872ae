package rowsum

import (
	"errors"
	"fmt"
	"sync"

	"github.com/peerkv/peerkv/core/data"
)

var _ data.Canceler = (*Writer)(nil)

// Writer starts a transport's writes, summing the source rows of those
// that ask for it off the caller's thread (the caller may be the host's
// scheduler thread). A summed write runs in chunks: each chunk's rows are
// summed, then its transfer starts while the next chunk is summed, so the
// sums cover what each row held when its send began (a row changed while
// its transfer runs fails the check) and summing overlaps the copy. It
// numbers transfers itself; read completions from Writer, not from the
// transport.
type Writer struct {
	inner  data.Transport
	region data.Region
	outbox *data.Outbox

	mu      sync.Mutex
	next    uint64
	started map[uint64]*transfer // the transport's id -> the write it is part of
	writes  map[uint64]*transfer // Writer's id -> its write, until completed
	closed  bool
	summing sync.WaitGroup

	// beforeSend, if set (tests), runs after each chunk's sums and before
	// its transfer starts.
	beforeSend func(peerID string, src []uint64)
}

// transfer is one write as its caller sees it; a summed one may be several
// of the transport's. Its fields change under Writer.mu.
type transfer struct {
	peerID  string
	id      uint64
	sums    []uint64 // nil for a write without sums
	bySum   bool     // the path sums it (data.Summer): its completion brings the sums
	pending int      // the transport's transfers not yet completed
	issued  bool     // every chunk started, or the write gave up starting more
	err     error    // the first failure
}

// chunkBytes is how many bytes of rows a summed write sums before it
// starts their transfer: large enough that a transfer's fixed costs stay
// small, small enough that the first transfer starts within milliseconds.
const chunkBytes = 32 << 20

// NewWriter wraps inner, whose local rows are region's.
func NewWriter(inner data.Transport, region data.Region) *Writer {
	w := &Writer{inner: inner, region: region, outbox: data.NewOutbox(1024),
		started: map[uint64]*transfer{}, writes: map[uint64]*transfer{}}
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
	t := &transfer{peerID: peerID, id: w.next, pending: 1, issued: true}
	w.started[innerID], w.writes[t.id] = t, t
	return w.next, nil
}

// WriteSummed starts a transfer whose completion carries the XXH3-64 of
// each source row (Completion.Sums). A path that sums its own writes
// (data.Summer: the same-host copy) takes them as it copies; otherwise they
// are summed on a goroutine of its own, chunk by chunk, each chunk's
// transfer starting once its rows are summed. Failures after it returned
// arrive as its completion.
func (w *Writer) WriteSummed(peerID string, src, dst []uint64) (uint64, error) {
	rows := w.region.NumRows()
	for _, r := range src {
		if r >= rows {
			return 0, fmt.Errorf("%w: source row %d of %d", data.ErrRowOutOfRange, r, rows)
		}
	}
	if len(src) != len(dst) {
		return 0, fmt.Errorf("rowsum: %d source rows for %d destination rows", len(src), len(dst))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return 0, data.ErrClosed
	}
	if s, ok := w.inner.(data.Summer); ok {
		innerID, err := s.WriteSummed(peerID, src, dst)
		if err == nil {
			w.next++
			t := &transfer{peerID: peerID, id: w.next, pending: 1, issued: true, bySum: true}
			w.started[innerID], w.writes[t.id] = t, t
			return w.next, nil
		}
		if !errors.Is(err, data.ErrNotSummed) {
			return 0, err
		}
	}
	w.next++
	t := &transfer{peerID: peerID, id: w.next, sums: make([]uint64, len(src))}
	w.writes[t.id] = t
	hook := w.beforeSend
	w.summing.Add(1)
	go func() {
		defer w.summing.Done()
		step := max(1, int(chunkBytes/max(1, w.region.RowLen)))
		for off := 0; off < len(src); off += step {
			end := min(off+step, len(src))
			copy(t.sums[off:end], Rows(w.region, src[off:end]))
			if hook != nil {
				hook(peerID, src[off:end])
			}
			if !w.start(t, src[off:end], dst[off:end]) {
				break
			}
		}
		w.mu.Lock()
		t.issued = true
		done := t.pending == 0
		w.mu.Unlock()
		if done {
			w.complete(t)
		}
	}()
	return t.id, nil
}

// start starts one chunk's transfer, unless Writer closed, the write was
// canceled or an earlier chunk already failed it (the write fails anyway:
// nothing more of it goes on the link); false when it did not (t.err says
// why).
func (w *Writer) start(t *transfer, src, dst []uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if t.err != nil {
		return false
	}
	err := data.ErrClosed
	if !w.closed {
		var innerID uint64
		if innerID, err = w.inner.Write(t.peerID, src, dst); err == nil {
			t.pending++
			w.started[innerID] = t
			return true
		}
	}
	if t.err == nil {
		t.err = err
	}
	return false
}

// complete delivers t's one completion.
func (w *Writer) complete(t *transfer) {
	w.mu.Lock()
	delete(w.writes, t.id)
	c := data.Completion{PeerID: t.peerID, ID: t.id, Err: t.err}
	w.mu.Unlock()
	if c.Err == nil {
		c.Sums = t.sums
	}
	w.outbox.Send(c)
}

// Cancel implements data.Canceler under Writer's ids (a caller holds no
// other): the write's chunks not started yet never start, and the
// transport cancels those it runs, when it can; the write then completes
// failed with data.ErrCanceled once they ended.
func (w *Writer) Cancel(peerID string, id uint64) {
	w.mu.Lock()
	t := w.writes[id]
	if t == nil || t.peerID != peerID {
		w.mu.Unlock()
		return
	}
	if t.err == nil {
		t.err = data.ErrCanceled
	}
	var running []uint64
	for innerID, x := range w.started {
		if x == t {
			running = append(running, innerID)
		}
	}
	w.mu.Unlock()
	// Outside mu: the transport may report at once, and forward takes mu.
	if c, ok := w.inner.(data.Canceler); ok {
		for _, innerID := range running {
			c.Cancel(peerID, innerID)
		}
	}
}

// SetBeforeSend makes every later summed write call f between the read of
// rows src for their sums and the read for their send, whichever comes
// first: after each chunk's sums and before its transfer starts, or, on a
// path that sums (data.Summer), after its copy and before its sums. Tests
// change a source row there.
func (w *Writer) SetBeforeSend(f func(peerID string, src []uint64)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.beforeSend = f
	if s, ok := w.inner.(data.Summer); ok {
		s.SetBetweenReads(f)
	}
}

// Completions delivers each write's outcome once, under Writer's ids.
func (w *Writer) Completions() <-chan data.Completion { return w.outbox.C() }

// forward applies the transport's completions until it closes them.
func (w *Writer) forward() {
	for c := range w.inner.Completions() {
		w.mu.Lock()
		t := w.started[c.ID]
		delete(w.started, c.ID)
		done := false
		if t != nil {
			t.pending--
			if c.Err != nil && t.err == nil {
				t.err = c.Err
			}
			if t.bySum {
				t.sums = c.Sums
			}
			done = t.issued && t.pending == 0
		}
		w.mu.Unlock()
		if done {
			w.complete(t)
		}
	}
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.summing.Wait()
	w.outbox.Finish()
}

// Close closes the transport; writes still summing complete as failed. It
// returns once no goroutine of Writer reads the region (the host may free
// it then).
func (w *Writer) Close() error {
	w.mu.Lock()
	w.closed = true
	w.mu.Unlock()
	w.outbox.StartClosing()
	err := w.inner.Close()
	w.summing.Wait()
	return err
}

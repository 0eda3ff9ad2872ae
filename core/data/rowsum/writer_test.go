package rowsum

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/data"
)

// fakePath records writes and completes them when the test says.
type fakePath struct {
	data.Transport
	mu     sync.Mutex
	writes [][]uint64
	fail   int // the write (1-based) that fails to start, 0 none
	done   chan data.Completion
}

func (f *fakePath) Write(peerID string, src, dst []uint64) (uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.writes = append(f.writes, src)
	if len(f.writes) == f.fail {
		return 0, errors.New("no room")
	}
	return uint64(len(f.writes)), nil
}

func (f *fakePath) Completions() <-chan data.Completion { return f.done }
func (f *fakePath) Close() error                        { close(f.done); return nil }

func (f *fakePath) started() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.writes)
}

func next(t *testing.T, w *Writer) data.Completion {
	t.Helper()
	select {
	case c := <-w.Completions():
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no completion")
		return data.Completion{}
	}
}

// A summed write over several chunks completes once, after every chunk's
// transfer, with every row's sum in order; a chunk that fails fails it.
func TestSummedWriteRunsInChunksAndCompletesOnce(t *testing.T) {
	const rowLen = 8 << 20 // 4 rows a chunk
	r := region(10, rowLen)
	f := &fakePath{done: make(chan data.Completion, 16)}
	w := NewWriter(f, r)
	defer w.Close()
	src := []uint64{9, 8, 7, 6, 5, 4, 3, 2, 1}
	id, err := w.WriteSummed("p", src, []uint64{0, 1, 2, 3, 4, 5, 6, 7, 8})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return f.started() == 3 }, 10*time.Second, time.Millisecond)
	assert.Equal(t, [][]uint64{{9, 8, 7, 6}, {5, 4, 3, 2}, {1}}, f.writes)
	for i := 1; i <= 3; i++ {
		f.done <- data.Completion{PeerID: "p", ID: uint64(i)}
	}
	c := next(t, w)
	assert.Equal(t, id, c.ID)
	require.NoError(t, c.Err)
	assert.Equal(t, Rows(r, src), c.Sums)

	f.fail = 5 // the second chunk of the next write
	id, err = w.WriteSummed("p", src, []uint64{0, 1, 2, 3, 4, 5, 6, 7, 8})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return f.started() == 5 }, 10*time.Second, time.Millisecond)
	f.done <- data.Completion{PeerID: "p", ID: 4}
	c = next(t, w)
	assert.Equal(t, id, c.ID)
	assert.ErrorContains(t, c.Err, "no room")
	assert.Nil(t, c.Sums)
	assert.Equal(t, 5, f.started(), "no chunk starts after one failed")
	select {
	case c := <-w.Completions():
		t.Fatalf("a second completion: %+v", c)
	case <-time.After(50 * time.Millisecond):
	}
}

// Close returns only once no summing goroutine reads the region, and the
// write it cut short completes failed, once.
func TestCloseWaitsForTheSumsInFlight(t *testing.T) {
	r := region(4, 4096)
	f := &fakePath{done: make(chan data.Completion, 16)}
	w := NewWriter(f, r)
	summed, release := make(chan struct{}), make(chan struct{})
	w.SetBeforeSend(func(string, []uint64) { close(summed); <-release })
	id, err := w.WriteSummed("p", []uint64{0, 1}, []uint64{2, 3})
	require.NoError(t, err)
	<-summed
	closed := make(chan error)
	go func() { closed <- w.Close() }()
	select {
	case <-closed:
		t.Fatal("Close returned while a write was still reading the region")
	case <-time.After(100 * time.Millisecond):
	}
	close(release)
	select {
	case err := <-closed:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return")
	}
	c := next(t, w)
	assert.Equal(t, id, c.ID)
	assert.ErrorIs(t, c.Err, data.ErrClosed)
	assert.Zero(t, f.started(), "nothing starts once closed")
}

// summingPath is a fakePath whose writes to peer "shm" it sums itself
// (data.Summer), as the same-host path does; others it cannot.
type summingPath struct {
	*fakePath
	between func(string, []uint64)
}

func (s *summingPath) WriteSummed(peerID string, src, dst []uint64) (uint64, error) {
	if peerID != "shm" {
		return 0, data.ErrNotSummed
	}
	return s.Write(peerID, src, dst)
}

func (s *summingPath) SetBetweenReads(f func(string, []uint64)) { s.between = f }

// A path that sums its own writes gets the summed write whole, its
// completion's sums pass through, and the test hook goes to it; a peer
// its path cannot sum for gets the Writer's own chunked sums.
func TestSummedWriteGoesToAPathThatSums(t *testing.T) {
	r := region(4, 1<<10)
	s := &summingPath{fakePath: &fakePath{done: make(chan data.Completion, 16)}}
	w := NewWriter(s, r)
	defer s.Close()
	w.SetBeforeSend(func(string, []uint64) {})
	assert.NotNil(t, s.between, "the hook runs where the path reads the rows")

	id, err := w.WriteSummed("shm", []uint64{0, 1}, []uint64{2, 3})
	require.NoError(t, err)
	require.Equal(t, 1, s.started(), "one write, summed by the path")
	s.done <- data.Completion{PeerID: "shm", ID: 1, Sums: []uint64{7, 8}}
	c := next(t, w)
	assert.Equal(t, id, c.ID)
	assert.Equal(t, []uint64{7, 8}, c.Sums)

	id, err = w.WriteSummed("tcp", []uint64{2}, []uint64{0})
	require.NoError(t, err)
	require.Eventually(t, func() bool { return s.started() == 2 }, 10*time.Second, time.Millisecond)
	s.done <- data.Completion{PeerID: "tcp", ID: 2}
	c = next(t, w)
	assert.Equal(t, id, c.ID)
	assert.Equal(t, []uint64{Row(r.Row(2))}, c.Sums, "summed by the Writer")
}

// cancelPath is a fakePath that can cancel: it records the ids it was
// asked to cancel and completes them failed.
type cancelPath struct {
	*fakePath
	canceled []uint64
}

func (c *cancelPath) Cancel(peerID string, id uint64) {
	c.mu.Lock()
	c.canceled = append(c.canceled, id)
	c.mu.Unlock()
	c.done <- data.Completion{PeerID: peerID, ID: id, Err: data.ErrCanceled}
}

// Canceling a write under Writer's id cancels the transport's transfer
// that runs it (under the transport's id, which differs), never another
// one, and the write completes once, canceled.
func TestCancelStopsAWriteUnderItsOwnID(t *testing.T) {
	rows := 4
	region := data.Region{Mem: make([]byte, rows*64), RowLen: 64}
	path := &cancelPath{fakePath: &fakePath{done: make(chan data.Completion, 8)}}
	w := NewWriter(path, region)
	defer w.Close()
	// The transport numbers from 1: a write of its own first, so that
	// Writer's ids and the transport's differ.
	_, err := path.fakePath.Write("p", []uint64{0}, []uint64{0})
	require.NoError(t, err)
	other, err := w.Write("p", []uint64{1}, []uint64{1}) // Writer's 1, the transport's 2
	require.NoError(t, err)
	id, err := w.WriteSummed("p", []uint64{2, 3}, []uint64{2, 3}) // Writer's 2, the transport's 3
	require.NoError(t, err)
	require.Eventually(t, func() bool { return path.started() == 3 }, 10*time.Second, time.Millisecond)

	var c data.Canceler = w
	c.Cancel("q", id) // another peer's id: nothing
	c.Cancel("p", id)
	got := next(t, w)
	assert.Equal(t, id, got.ID)
	assert.ErrorIs(t, got.Err, data.ErrCanceled)
	assert.Nil(t, got.Sums, "a canceled write carries no sums")
	path.mu.Lock()
	assert.Equal(t, []uint64{3}, path.canceled, "only the transport's transfer that runs the write is canceled")
	path.mu.Unlock()

	path.done <- data.Completion{PeerID: "p", ID: 2}
	got = next(t, w)
	assert.Equal(t, other, got.ID)
	assert.NoError(t, got.Err, "the write beside it is not canceled")
}

// summingCancelPath sums its own writes and can cancel them.
type summingCancelPath struct{ *cancelPath }

func (s summingCancelPath) WriteSummed(peerID string, src, dst []uint64) (uint64, error) {
	return s.Write(peerID, src, dst)
}

func (s summingCancelPath) SetBetweenReads(func(string, []uint64)) {}

// A write the path sums is canceled under Writer's id as any other: the
// path's transfer is canceled and the write completes once, failed,
// without sums.
func TestCancelStopsAWriteThePathSums(t *testing.T) {
	path := summingCancelPath{&cancelPath{fakePath: &fakePath{done: make(chan data.Completion, 8)}}}
	w := NewWriter(path, region(2, 64))
	defer w.Close()
	_, err := path.fakePath.Write("p", []uint64{0}, []uint64{0}) // the transport's 1: ids differ
	require.NoError(t, err)
	id, err := w.WriteSummed("p", []uint64{1}, []uint64{1})
	require.NoError(t, err)
	w.Cancel("p", id)
	c := next(t, w)
	assert.Equal(t, id, c.ID)
	require.ErrorIs(t, c.Err, data.ErrCanceled)
	assert.Nil(t, c.Sums)
	path.mu.Lock()
	assert.Equal(t, []uint64{2}, path.canceled, "the transport's transfer that runs it")
	path.mu.Unlock()
}

// A chunk whose transfer failed fails the write: the chunks after it are
// not started (nothing more of a failed write goes on the link).
func TestNoChunkStartsAfterOneFailed(t *testing.T) {
	const rowLen = 8 << 20 // 4 rows a chunk
	r := region(10, rowLen)
	f := &fakePath{done: make(chan data.Completion, 16)}
	w := NewWriter(f, r)
	defer w.Close()
	chunk := make(chan struct{}, 4)
	proceed := make(chan struct{})
	w.SetBeforeSend(func(string, []uint64) {
		chunk <- struct{}{}
		<-proceed
	})
	src := []uint64{9, 8, 7, 6, 5, 4, 3, 2, 1}
	id, err := w.WriteSummed("p", src, []uint64{0, 1, 2, 3, 4, 5, 6, 7, 8})
	require.NoError(t, err)
	<-chunk
	proceed <- struct{}{} // the first chunk starts
	<-chunk               // the second waits to start
	require.Equal(t, 1, f.started())
	f.done <- data.Completion{PeerID: "p", ID: 1, Err: errors.New("link lost")}
	require.Eventually(t, func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.writes[id] != nil && w.writes[id].err != nil
	}, 10*time.Second, time.Millisecond, "the first chunk's failure reached the write")
	close(proceed)
	c := next(t, w)
	assert.Equal(t, id, c.ID)
	assert.ErrorContains(t, c.Err, "link lost")
	assert.Equal(t, 1, f.started(), "no chunk starts after one failed")
}

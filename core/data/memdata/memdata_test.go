package memdata

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/data"
)

const (
	testRows   = 8
	testRowLen = 64
	waitLimit  = 5 * time.Second
)

// newRegion returns a region whose row i is filled with byte fill+i.
func newRegion(fill byte) data.Region {
	r := data.Region{Mem: make([]byte, testRows*testRowLen), RowLen: testRowLen}
	for i := uint64(0); i < testRows; i++ {
		row := r.Row(i)
		for j := range row {
			row[j] = fill + byte(i)
		}
	}
	return r
}

func infoOf(r data.Region) data.PeerInfo {
	return data.PeerInfo{NumRows: r.NumRows(), RowLen: r.RowLen}
}

func nextCompletion(t *testing.T, tr *Transport) data.Completion {
	t.Helper()
	select {
	case c, ok := <-tr.Completions():
		require.True(t, ok, "completions closed")
		return c
	case <-time.After(waitLimit):
		t.Fatal("no completion within the wait limit")
		return data.Completion{}
	}
}

// pair builds producer "a" and consumer "b", with a knowing b.
func pair(t *testing.T, guard data.WriteGuard) (*Hub, *Transport, *Transport, data.Region, data.Region) {
	t.Helper()
	hub := NewHub()
	srcRegion, dstRegion := newRegion(0x10), newRegion(0x80)
	a := hub.Transport("a", srcRegion, nil)
	b := hub.Transport("b", dstRegion, guard)
	t.Cleanup(func() { _ = a.Close(); _ = b.Close() })
	require.NoError(t, a.AddPeer("b", infoOf(dstRegion)))
	return hub, a, b, srcRegion, dstRegion
}

func TestWriteCopiesNamedRowsOnly(t *testing.T) {
	_, a, _, src, dst := pair(t, nil)
	untouched := bytes.Clone(dst.Mem)

	id, err := a.Write("b", []uint64{1, 2}, []uint64{5, 0})
	require.NoError(t, err)
	c := nextCompletion(t, a)
	assert.Equal(t, data.Completion{PeerID: "b", ID: id}, c)

	assert.Equal(t, src.Row(1), dst.Row(5))
	assert.Equal(t, src.Row(2), dst.Row(0))
	for _, row := range []uint64{1, 2, 3, 4, 6, 7} {
		assert.Equal(t, untouched[row*testRowLen:(row+1)*testRowLen], dst.Row(row), "row %d", row)
	}
	assert.Equal(t, []byte("memdata:a"), a.AgentMetadata())
	assert.Empty(t, a.DataAddr())
}

func TestAddPeerChecks(t *testing.T) {
	hub := NewHub()
	a := hub.Transport("a", newRegion(0), nil)
	defer a.Close()
	assert.ErrorIs(t, a.AddPeer("ghost", infoOf(newRegion(0))), data.ErrUnknownPeer)
	b := hub.Transport("b", newRegion(0), nil)
	defer b.Close()
	err := a.AddPeer("b", data.PeerInfo{RowLen: testRowLen * 2})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "row length")
}

func TestWriteArgumentErrors(t *testing.T) {
	_, a, _, _, _ := pair(t, nil)
	_, err := a.Write("c", []uint64{0}, []uint64{0})
	assert.ErrorIs(t, err, data.ErrUnknownPeer)
	_, err = a.Write("b", []uint64{testRows}, []uint64{0})
	assert.ErrorIs(t, err, data.ErrRowOutOfRange)
	_, err = a.Write("b", []uint64{0, 1}, []uint64{0})
	assert.Error(t, err)
}

func TestDestinationOutOfRangeWritesNothing(t *testing.T) {
	_, a, _, _, dst := pair(t, nil)
	before := bytes.Clone(dst.Mem)
	_, err := a.Write("b", []uint64{0, 1}, []uint64{0, testRows})
	require.NoError(t, err)
	assert.ErrorIs(t, nextCompletion(t, a).Err, data.ErrRowOutOfRange)
	assert.Equal(t, before, dst.Mem)
}

func TestGuardRejectionWritesNothing(t *testing.T) {
	var asked []string
	var mu sync.Mutex
	guard := func(peerID string, row uint64) bool {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, peerID)
		return row != 3
	}
	_, a, _, _, dst := pair(t, data.GuardFunc(guard))
	before := bytes.Clone(dst.Mem)
	_, err := a.Write("b", []uint64{0, 1}, []uint64{2, 3})
	require.NoError(t, err)
	assert.ErrorIs(t, nextCompletion(t, a).Err, data.ErrRejected)
	assert.Equal(t, before, dst.Mem)
	mu.Lock()
	assert.Equal(t, []string{"a", "a"}, asked, "the guard is told who writes")
	mu.Unlock()
}

func TestSetFail(t *testing.T) {
	hub, a, _, _, _ := pair(t, nil)
	hub.SetFail("b", true)
	_, err := a.Write("b", []uint64{0}, []uint64{0})
	require.NoError(t, err)
	assert.ErrorIs(t, nextCompletion(t, a).Err, ErrInjected)
	hub.SetFail("b", false)
	_, err = a.Write("b", []uint64{0}, []uint64{0})
	require.NoError(t, err)
	assert.NoError(t, nextCompletion(t, a).Err)
}

func TestDelayHoldsCompletion(t *testing.T) {
	hub, a, _, _, _ := pair(t, nil)
	hub.SetDelay(200 * time.Millisecond)
	start := time.Now()
	_, err := a.Write("b", []uint64{0}, []uint64{0})
	require.NoError(t, err)
	require.NoError(t, nextCompletion(t, a).Err)
	assert.GreaterOrEqual(t, time.Since(start), 200*time.Millisecond)
}

func TestRemovePeerFailsPending(t *testing.T) {
	hub, a, _, _, _ := pair(t, nil)
	hub.SetDelay(time.Hour)
	id, err := a.Write("b", []uint64{0}, []uint64{0})
	require.NoError(t, err)
	a.RemovePeer("b")
	c := nextCompletion(t, a)
	assert.Equal(t, id, c.ID)
	assert.ErrorIs(t, c.Err, data.ErrUnknownPeer)
	_, err = a.Write("b", []uint64{0}, []uint64{0})
	assert.ErrorIs(t, err, data.ErrUnknownPeer)
}

func TestCloseFailsPendingAndClosesCompletions(t *testing.T) {
	hub, a, _, _, _ := pair(t, nil)
	hub.SetDelay(time.Hour)
	id, err := a.Write("b", []uint64{0}, []uint64{0})
	require.NoError(t, err)
	require.NoError(t, a.Close())
	require.NoError(t, a.Close(), "Close is idempotent")

	c := nextCompletion(t, a)
	assert.Equal(t, id, c.ID)
	assert.ErrorIs(t, c.Err, data.ErrClosed)
	_, open := <-a.Completions()
	assert.False(t, open, "completions closed after Close")
	_, err = a.Write("b", []uint64{0}, []uint64{0})
	assert.ErrorIs(t, err, data.ErrClosed)
}

func TestConcurrentWritesCompleteOnce(t *testing.T) {
	_, a, _, _, _ := pair(t, nil)
	const writers, perWriter = 8, 50
	ids := make(chan uint64, writers*perWriter)
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < perWriter; i++ {
				id, err := a.Write("b", []uint64{uint64(i % testRows)}, []uint64{uint64(i % testRows)})
				assert.NoError(t, err)
				ids <- id
			}
		}()
	}
	wg.Wait()
	close(ids)
	want := map[uint64]bool{}
	for id := range ids {
		want[id] = true
	}
	require.Len(t, want, writers*perWriter, "ids are unique")
	for range writers * perWriter {
		c := nextCompletion(t, a)
		require.NoError(t, c.Err)
		require.True(t, want[c.ID], "unexpected or repeated completion %d", c.ID)
		delete(want, c.ID)
	}
	select {
	case c := <-a.Completions():
		t.Fatalf("extra completion %+v", c)
	case <-time.After(50 * time.Millisecond):
	}
}

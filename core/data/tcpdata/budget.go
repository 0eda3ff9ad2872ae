package tcpdata

import (
	"sync"
	"time"

	"github.com/peerkv/peerkv/core/data"
)

// byteBudget caps the bytes held for parts being received, on all
// connections together. A part takes its share before it allocates and
// gives it back when it ends; one that finds no room waits a bounded time.
// (A weighted semaphore; the standard library has none and this is the
// only one the module would need.)
type byteBudget struct {
	limit int64

	mu    sync.Mutex
	held  int64
	freed chan struct{} // closed and replaced whenever bytes are given back
}

func newByteBudget(limit int64) *byteBudget {
	return &byteBudget{limit: limit, freed: make(chan struct{})}
}

// acquire takes n bytes, waiting at most wait for them (or until stop is
// closed); it reports whether it took them. n must not exceed the limit.
func (b *byteBudget) acquire(n int64, wait time.Duration, stop <-chan struct{}) bool {
	var timeout <-chan time.Time
	for {
		b.mu.Lock()
		if b.held+n <= b.limit {
			b.held += n
			b.mu.Unlock()
			return true
		}
		freed := b.freed
		b.mu.Unlock()
		if timeout == nil {
			timer := time.NewTimer(wait)
			defer timer.Stop()
			timeout = timer.C
		}
		select {
		case <-freed:
		case <-timeout:
			return false
		case <-stop:
			return false
		}
	}
}

// release gives back n bytes taken by acquire.
func (b *byteBudget) release(n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.held -= n
	close(b.freed)
	b.freed = make(chan struct{})
	b.mu.Unlock()
}

// inUse is the number of bytes held now.
func (b *byteBudget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held
}

// partBytes is what a part of partRows rows holds while it is received:
// its destination rows, and a staged row when a guard checks each row.
func partBytes(partRows uint32, rowLen uint64, guarded bool) int64 {
	n := int64(partRows) * rowIndexLen
	if guarded {
		n += int64(rowLen)
	}
	return n
}

// largestPartBytes is what the largest part a region allows holds.
func largestPartBytes(r data.Region) int64 {
	return partBytes(uint32(min(r.NumRows(), maxTransferRows)), r.RowLen, true)
}

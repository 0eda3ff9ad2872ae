// Package rowsum checksums rows for verified pulls: the producer sums each
// row it sends, the consumer sums each row where it landed, and a load is
// reported successful only when they agree (docs/security.md G18).
//
// The function is XXH3-64 (seed 0, github.com/zeebo/xxh3: AVX2 or SSE2 on
// amd64). BenchmarkCandidates measures it against CRC-32C (the function
// before it) and xxHash64, in the cache and out of it: docs/benchmarks.md
// has the figures behind the choice.
package rowsum

import (
	"runtime"
	"sync"

	"github.com/zeebo/xxh3"

	"github.com/peerkv/peerkv/core/data"
)

// Row is the checksum of one row.
func Row(b []byte) uint64 { return xxh3.Hash(b) }

// parallelBytes is the batch size from which Rows spreads over the CPUs:
// below it, starting goroutines costs more than it saves.
const parallelBytes = 8 << 20

// Rows sums region's rows, in order, spreading a large batch over the CPUs.
// Every row must be inside the region.
func Rows(region data.Region, rows []uint64) []uint64 {
	sums := make([]uint64, len(rows))
	each := func(i int) { sums[i] = Row(region.Row(rows[i])) }
	workers := min(runtime.GOMAXPROCS(0), len(rows))
	if workers < 2 || uint64(len(rows))*region.RowLen < parallelBytes {
		for i := range rows {
			each(i)
		}
		return sums
	}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < len(rows); i += workers {
				each(i)
			}
		}()
	}
	wg.Wait()
	return sums
}

// Mismatch returns the index of the first row of region whose checksum is
// not sums' (parallel to rows), or -1 when every row matches.
func Mismatch(region data.Region, rows []uint64, sums []uint64) int {
	got := Rows(region, rows)
	for i := range got {
		if got[i] != sums[i] {
			return i
		}
	}
	return -1
}

// piece is how much of a row CopySummed copies before it sums that piece:
// small enough that the sum reads it from the CPU's nearest caches.
const piece = 256 << 10

var hashers = sync.Pool{New: func() any { return xxh3.New() }}

// CopySummed copies src into dst (of equal length) a piece at a time,
// summing each piece of dst right after writing it, while it is in the
// cache, and returns dst's checksum (Row(dst) as the copy left it).
func CopySummed(dst, src []byte) uint64 {
	h := hashers.Get().(*xxh3.Hasher)
	defer hashers.Put(h)
	h.Reset()
	for off := 0; off < len(dst); off += piece {
		end := min(off+piece, len(dst))
		copy(dst[off:end], src[off:end])
		_, _ = h.Write(dst[off:end])
	}
	return h.Sum64()
}

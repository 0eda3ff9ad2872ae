package rowsum

import (
	"hash/crc32"
	"runtime"
	"sync"
	"testing"

	"github.com/cespare/xxhash/v2"
	"github.com/zeebo/xxh3"
)

// The candidate row functions, measured in one run (docs/benchmarks.md has
// the figures behind the choice of xxh3): in the cache (one 256 KiB piece
// summed again and again, as a sum right after the copy of a piece sees it)
// and out of it (2 MiB rows of a 512 MiB region, each read once per pass,
// as a pass over a landed load sees them).
func BenchmarkCandidates(b *testing.B) {
	crc := crc32.MakeTable(crc32.Castagnoli)
	fns := []struct {
		name string
		sum  func([]byte) uint64
	}{
		{"crc32c", func(p []byte) uint64 { return uint64(crc32.Checksum(p, crc)) }},
		{"xxh3", xxh3.Hash},
		{"xxhash64", xxhash.Sum64},
	}
	for _, f := range fns {
		b.Run(f.name+"/cache-256KiB", func(b *testing.B) {
			piece := region(1, 256<<10).Mem
			b.SetBytes(int64(len(piece)))
			for b.Loop() {
				f.sum(piece)
			}
		})
		b.Run(f.name+"/memory-2MiB-rows", func(b *testing.B) {
			r := region(256, 2<<20)
			b.SetBytes(int64(r.RowLen))
			i := uint64(0)
			for b.Loop() {
				f.sum(r.Row(i))
				i = (i + 1) % r.NumRows()
			}
		})
	}
	b.Run("memcpy/memory-2MiB-rows", func(b *testing.B) {
		r, dst := region(256, 2<<20), region(256, 2<<20).Mem // both touched: no page faults timed
		b.SetBytes(int64(r.RowLen))
		i := uint64(0)
		for b.Loop() {
			copy(dst[i*r.RowLen:(i+1)*r.RowLen], r.Row(i))
			i = (i + 1) % r.NumRows()
		}
	})
}

// BenchmarkPassOverRegion is the consumer's check read again over a load
// it cannot trust landed sums for (the same-host path): Rows over 256 rows
// of 2 MiB, spread over the CPUs, against a copy of the same bytes split
// over as many goroutines, as the same-host copy splits it. Out of cache:
// the two cost about the same, which bounds what a verified same-host pull
// can cost against a plain one (docs/benchmarks.md).
func BenchmarkPassOverRegion(b *testing.B) {
	r, dst := region(256, 2<<20), region(256, 2<<20).Mem
	rows := make([]uint64, r.NumRows())
	for i := range rows {
		rows[i] = uint64(i)
	}
	b.Run("sum", func(b *testing.B) {
		b.SetBytes(int64(len(r.Mem)))
		for b.Loop() {
			Rows(r, rows)
		}
	})
	b.Run("copy", func(b *testing.B) {
		b.SetBytes(int64(len(r.Mem)))
		workers := runtime.GOMAXPROCS(0)
		for b.Loop() {
			var wg sync.WaitGroup
			for w := range workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					lo, hi := w*len(r.Mem)/workers, (w+1)*len(r.Mem)/workers
					copy(dst[lo:hi], r.Mem[lo:hi])
				}()
			}
			wg.Wait()
		}
	})
}

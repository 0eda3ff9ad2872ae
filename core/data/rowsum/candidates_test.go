package rowsum

import (
	"hash/crc32"
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

package nixl

import (
	"fmt"
	"testing"
	"time"
)

// BenchmarkWrite moves rows between two agents of this process (UCX over
// loopback) and waits for each transfer; -benchmem shows whether
// allocations grow with rows. Destination rows run backwards, as in the
// shm benchmark, so no run of rows is contiguous on both sides.
func BenchmarkWrite(b *testing.B) {
	requireNIXL(b)
	for _, bc := range []struct{ rows, rowLen int }{
		{1, 4 << 10},
		{64, 4 << 10},
		{64, 256 << 10},
	} {
		b.Run(fmt.Sprintf("rows=%d/rowLen=%dKiB", bc.rows, bc.rowLen>>10), func(b *testing.B) {
			from, to := newSizedTransport(b, bc.rows, bc.rowLen, 1), newSizedTransport(b, bc.rows, bc.rowLen, 2)
			if err := from.AddPeer("to", infoOf(to)); err != nil {
				b.Fatal(err)
			}
			src, dst := make([]uint64, bc.rows), make([]uint64, bc.rows)
			for i := range src {
				src[i], dst[i] = uint64(i), uint64(bc.rows-1-i)
			}
			b.SetBytes(int64(bc.rows * bc.rowLen))
			b.ReportAllocs()
			for b.Loop() { // setup (two UCX agents) runs once
				if err := writeAndWait(from, "to", src, dst, 20*time.Second); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

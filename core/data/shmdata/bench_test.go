package shmdata

import (
	"fmt"
	"testing"
)

// BenchmarkWrite copies rows into a consumer in another process (the
// transport refuses its own process) and waits for each transfer; -benchmem
// shows whether allocations grow with rows. Destination rows run backwards
// so no two rows merge into one mapped range; with scattered sources, which
// run backwards too, no two rows merge into one read either: every row
// takes the per-batch path.
func BenchmarkWrite(b *testing.B) {
	for _, bc := range []struct {
		rows, rowLen int
		scattered    bool
	}{
		{1, 4 << 10, false},
		{64, 4 << 10, false},
		{64, 4 << 10, true},
		{64, 256 << 10, false},
		{64, 256 << 10, true},
	} {
		name := fmt.Sprintf("rows=%d/rowLen=%dKiB", bc.rows, bc.rowLen>>10)
		if bc.scattered {
			name += "/scattered"
		}
		b.Run(name, func(b *testing.B) {
			cons := startChild(b, consID, bc.rows, bc.rowLen, 0)
			tr, _ := producer(b, prodID, bc.rows, bc.rowLen)
			if err := tr.AddPeer(consID, offered(cons.ask("offer %s", prodID))); err != nil {
				b.Fatal(err)
			}
			src, dst := make([]uint64, bc.rows), make([]uint64, bc.rows)
			for i := range src {
				src[i], dst[i] = uint64(i), uint64(bc.rows-1-i)
				if bc.scattered {
					src[i] = dst[i]
				}
			}
			b.SetBytes(int64(bc.rows * bc.rowLen))
			b.ReportAllocs()
			for b.Loop() { // setup (a process, a mapping) runs once

				id, err := tr.Write(consID, src, dst)
				if err != nil {
					b.Fatal(err)
				}
				if err := completion(b, tr, id); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

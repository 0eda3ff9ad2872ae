package multipath

import (
	"fmt"
	"testing"

	"github.com/peerkv/peerkv/core/data/memdata"
)

// BenchmarkWrite writes rows through the combined transport to a peer
// served by the real TCP path, and by the in-memory stand-in for NIXL
// (memdata), waiting for each transfer; -benchmem shows whether the
// routing or a path allocates per row.
func BenchmarkWrite(b *testing.B) {
	for _, path := range []struct {
		name      string
		offerNIXL bool   // the peer offers NIXL, which is preferred, or only TCP
		servedBy  string // what PathTo must say: memdata stands in as "nixl"
	}{{"tcp", false, "tcp"}, {"memdata", true, "nixl"}} {
		for _, rows := range []int{1, 64} {
			b.Run(fmt.Sprintf("path=%s/rows=%d/rowLen=%dKiB", path.name, rows, rowLen>>10), func(b *testing.B) {
				hub := memdata.NewHub()
				a, peer := newEndOfRows(b, hub, "a:1", rows), newEndOfRows(b, hub, "b:1", rows)
				tr, err := New("", a.nixl, a.tcp)
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() { _ = tr.Close() })
				if err := tr.AddPeer(peer.id, peer.info(path.offerNIXL, true)); err != nil {
					b.Fatal(err)
				}
				if got := tr.PathTo(peer.id); got != path.servedBy {
					b.Fatalf("the peer is served by %q, not %q", got, path.servedBy)
				}
				src, dst := make([]uint64, rows), make([]uint64, rows)
				for i := range src {
					src[i], dst[i] = uint64(i), uint64(rows-1-i)
				}
				b.SetBytes(int64(rows * rowLen))
				b.ReportAllocs()
				for b.Loop() {
					if _, err := tr.Write(peer.id, src, dst); err != nil {
						b.Fatal(err)
					}
					if c := completion(b, tr); c.Err != nil {
						b.Fatal(c.Err)
					}
				}
			})
		}
	}
}

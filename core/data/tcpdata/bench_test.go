package tcpdata

import (
	"testing"
	"time"
)

// BenchmarkWrite moves 64 rows of 64 KiB per op between two transports on
// loopback, in the clear and under TLS, for a throughput figure (-bench).
func BenchmarkWrite(b *testing.B) {
	for _, bc := range []struct {
		name string
		mode func(*Options)
	}{{"plaintext", nil}, {"TLS", encrypted}} {
		b.Run(bc.name, func(b *testing.B) {
			const rows = 64
			src, dst := randomRegion(b, rows), sentinelRegion(rows)
			quiet := func(o *Options) {
				if bc.mode != nil {
					bc.mode(o)
				}
				o.Logf = nil
			}
			a := newTransport(b, "a", src, quiet)
			r := newTransport(b, "b", dst, quiet)
			addPeer(b, a, "b", r)
			b.SetBytes(rows * rowLen)
			b.ResetTimer()
			for range b.N {
				if _, err := a.Write("b", seq(0, rows), seq(0, rows)); err != nil {
					b.Fatal(err)
				}
				select {
				case c := <-a.Completions():
					if c.Err != nil {
						b.Fatal(c.Err)
					}
				case <-time.After(waitLimit):
					b.Fatal("no completion")
				}
			}
		})
	}
}

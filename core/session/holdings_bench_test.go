package session

import (
	"fmt"
	"testing"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/protocol"
)

// BenchmarkInboundLookup measures one inbound lookup, from its frame to its
// answer, while the peer already holds a fetch round under each of kvIDs
// other kv ids: the cap check it passes must not grow with them.
func BenchmarkInboundLookup(b *testing.B) {
	for _, kvIDs := range []int{1, 100, 1000} {
		b.Run(fmt.Sprint("kvids=", kvIDs), func(b *testing.B) {
			p := handshaked(b, func(c *config.Config) { c.MaxRequestsPerPeer, c.MaxKeysPerPeer = 1<<20, 1<<20 })
			s, o := p.sb, p.b
			for i := range kvIDs {
				s.Handle(&protocol.Fetch{KVRequestID: fmt.Sprint("held-", i), Keys: [][]byte{key(i)}, BlockIndexes: []uint64{0}})
			}
			if kv, _ := s.Holds(); kv != kvIDs {
				b.Fatalf("the peer holds %d kv ids, want %d", kv, kvIDs)
			}
			o.env.Send = func(string, protocol.Message) error { return nil } // no wire encoding in the loop
			lookup := &protocol.Lookup{KVRequestID: "asked", Keys: [][]byte{key(1)}}
			misses := []Answer{AnswerMiss}
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				o.inbound = o.inbound[:0]
				s.Handle(lookup)
				if len(o.inbound) != 1 {
					b.Fatal("the lookup was refused")
				}
				l := o.inbound[0]
				l.CheckOut()
				if _, err := s.AnswerLookup(l, misses, -1, nil); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

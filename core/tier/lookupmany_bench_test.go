package tier_test

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/tier"
)

// BenchmarkLookupManyFirstAsk is one scheduler step's first ask of 256
// requests x 64 keys at one source (figure "step, first ask" of
// tests/bench/scheduler_calls.py, library side).
func BenchmarkLookupManyFirstAsk(b *testing.B) {
	c := newCluster(b)
	prod, cons := c.peer(1), c.peer(2)
	const reqs, per = 256, 64
	ks := make([][]byte, per)
	for i := range ks {
		ks[i] = key(i)
	}
	out := make([]tier.LookupResult, reqs*per)
	b.ReportAllocs()
	for n := 0; n < b.N; n++ {
		b.StopTimer()
		batch := make([]tier.RequestKeys, reqs)
		for r := range batch {
			id := fmt.Sprintf("r%d-%d", n, r)
			_, err := cons.StartRequest(id, p2pParams("kv-"+id, prod))
			require.NoError(b, err)
			cons.LookupMode(id)
			batch[r] = tier.RequestKeys{ReqID: id, Keys: ks}
		}
		b.StartTimer()
		require.NoError(b, cons.LookupMany(batch, out))
		b.StopTimer()
		for _, rk := range batch {
			require.NoError(b, cons.FinishRequest(rk.ReqID))
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*reqs*per), "ns/key")
}

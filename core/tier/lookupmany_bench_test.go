package tier_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/tier"
)

const benchReqs, benchKeysPerReq = 256, 64

// BenchmarkLookupManyFirstAsk is one scheduler step's first ask of 256
// requests x 64 keys at one source, timed until every key's answer reached
// the host (the loop's registration, the lookups and their answers);
// host-ns/key is what the host's thread paid, in LookupMany (figure "step,
// first ask" of tests/bench/scheduler_calls.py, library side).
func BenchmarkLookupManyFirstAsk(b *testing.B) {
	c := newCluster(b)
	prod, cons := c.node(1), c.node(2)
	ks := make([][]byte, benchKeysPerReq)
	for i := range ks {
		ks[i] = key(i)
	}
	out := make([]tier.LookupResult, benchReqs*benchKeysPerReq)
	var host time.Duration
	b.ReportAllocs()
	for n := 0; n < b.N; n++ {
		b.StopTimer()
		batch := make([]tier.RequestKeys, benchReqs)
		for r := range batch {
			id := fmt.Sprintf("r%d-%d", n, r)
			_, err := cons.StartRequest(id, p2pParams("kv-"+id, prod))
			require.NoError(b, err)
			cons.LookupMode(id)
			batch[r] = asking(id, ks)
		}
		b.StartTimer()
		start := time.Now()
		require.NoError(b, cons.LookupMany(batch, keyLen, out))
		host += time.Since(start)
		waitAnswered(b, prod, cons, len(out))
		b.StopTimer()
		for _, r := range out {
			require.Equal(b, tier.Retry, r)
		}
		for _, rk := range batch {
			require.NoError(b, cons.FinishRequest(rk.ReqID))
		}
	}
	keys := float64(b.N * len(out))
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/keys, "ns/key")
	b.ReportMetric(float64(host.Nanoseconds())/keys, "host-ns/key")
}

// waitAnswered serves prod's inbound lookups as its host would (it holds
// none of the keys) and takes cons's answer changes until n keys have one:
// every key ends MISS.
func waitAnswered(b *testing.B, prod, p *node, n int) {
	deadline := time.Now().Add(30 * time.Second)
	var nextJob int64
	for got := 0; got < n; {
		prod.serve(nil, &nextJob)
		require.True(b, time.Now().Before(deadline), "%d of %d keys answered", got, n)
		for _, ch := range p.TakeAnswers(func(tier.AnswerChange) bool { return true }) {
			require.False(b, ch.Failed)
			for _, r := range ch.Results {
				require.Equal(b, tier.Miss, r)
			}
			got += len(ch.Positions)
		}
		time.Sleep(50 * time.Microsecond)
	}
}

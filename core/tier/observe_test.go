package tier_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/tier"
)

// logLines returns the peer's pending log lines at INFO or above that
// mention who.
func logLines(p *node, who string) []string {
	var out []string
	for _, l := range strings.Split(string(p.TakeLogs(1<<20)), "\n") {
		if l == "" || strings.HasPrefix(l, "DEBUG ") || !strings.Contains(l, who) {
			continue
		}
		out = append(out, l)
	}
	return out
}

func histogramCount(h tier.Histogram) int64 {
	n := int64(0)
	for _, c := range h.Counts {
		n += c
	}
	return n
}

func histogramSum(h tier.Histogram) float64 {
	total := 0.0
	for _, s := range h.Sums {
		total += s
	}
	return total
}

// One rejected handshake is one line on each side, naming the cause on
// the side that knows it, and one count under that cause.
func TestARejectedHandshakeIsOneLinePerSideAndCountedByCause(t *testing.T) {
	for cause, mutate := range map[string]func(*config.Config){
		"hash_seed":   func(c *config.Config) { c.HashSeed = "other" },
		"fingerprint": func(c *config.Config) { c.ConfigFingerprint = "fedcba9876543210" },
	} {
		t.Run(cause, func(t *testing.T) {
			c := newCluster(t)
			prod, cons := c.node(1, mutate), c.node(2)
			_, err := cons.StartRequest("c", p2pParams("kv-rej", prod))
			require.NoError(t, err)
			require.Eventually(t, func() bool {
				r := cons.lookup("c", keys(1))
				_ = cons.OnScheduleEnd()
				return r[0] == tier.Miss
			}, 10*time.Second, 5*time.Millisecond)
			require.Eventually(t, func() bool {
				return prod.Stats().HandshakeRejections[cause] == 1 && cons.Stats().HandshakeRejections["refused_by_peer"] == 1
			}, 3*time.Second, 5*time.Millisecond, "prod %v, cons %v", prod.Stats().HandshakeRejections, cons.Stats().HandshakeRejections)

			prodLines := logLines(prod, cons.id)
			require.Len(t, prodLines, 1, "the rejecting side: %q", prodLines)
			assert.True(t, strings.HasPrefix(prodLines[0], "ERROR rejecting peer "+cons.id+": "), prodLines[0])
			assert.Contains(t, prodLines[0], "mismatch")
			consLines := logLines(cons, prod.id)
			var about []string
			for _, l := range consLines {
				if strings.Contains(l, "peer "+prod.id) {
					about = append(about, l)
				}
			}
			require.Len(t, about, 1, "the rejected side: %q", consLines)
			assert.True(t, strings.HasPrefix(about[0], "WARNING peer "+prod.id+": it refused our connect"), about[0])
			require.NoError(t, cons.FinishRequest("c"))
		})
	}
}

// A peer that shuts down says goodbye; the other side logs that at INFO,
// and the shutting-down side logs one INFO line.
func TestAnOrderlyShutdownIsNormalLifecycle(t *testing.T) {
	c := newCluster(t)
	prod, dec := c.node(1), c.node(2)
	_, err := prod.StartRequest("p", []byte(`{"remote_decoder":{"kv_request_id":"kv-bye"}}`))
	require.NoError(t, err)
	prod.fill(3, key(3))
	require.NoError(t, prod.SubmitStore("p", 1, keys(3), []int64{3}))
	_, err = dec.StartRequest("d", pdParams("kv-bye", prod))
	require.NoError(t, err)
	require.NoError(t, dec.SubmitLoad("d", 2, keys(3), []int64{9}))
	require.True(t, dec.waitJob(2, 3*time.Second).Success)
	require.NoError(t, dec.FinishRequest("d"))
	require.NoError(t, prod.FinishRequest("p"))
	prod.TakeLogs(1 << 20)
	dec.TakeLogs(1 << 20)

	require.NoError(t, prod.Shutdown())
	require.Eventually(t, func() bool { return dec.Stats().Sessions == 0 }, 3*time.Second, 5*time.Millisecond)
	lines := logLines(dec, prod.id)
	require.Len(t, lines, 1, "%q", lines)
	assert.Equal(t, "INFO peer "+prod.id+": it closed the session; session closed", lines[0])
	own := strings.TrimSpace(string(prod.TakeLogs(1 << 20)))
	assert.Equal(t, "INFO shutting down: 1 session(s) closed, 0 job(s) still in flight reported failed", own)
	assert.Empty(t, dec.Stats().HandshakeRejections)
}

// Loads, stores and bytes are counted under the data path that moved them,
// and the load and lookup histograms see every load and lookup.
func TestWorkIsCountedByDataPathAndTimed(t *testing.T) {
	c := newCluster(t)
	prod, dec := c.node(1), c.node(2)
	ks := keys(10, 11, 12, 13)
	_, err := prod.StartRequest("p", []byte(`{"remote_decoder":{"kv_request_id":"kv-path"}}`))
	require.NoError(t, err)
	for i, k := range ks {
		prod.fill(i, k)
	}
	require.NoError(t, prod.SubmitStore("p", 1, ks, []int64{0, 1, 2, 3}))
	_, err = dec.StartRequest("d", pdParams("kv-path", prod))
	require.NoError(t, err)
	require.NoError(t, dec.SubmitLoad("d", 5, ks, []int64{20, 21, 22, 23}))
	require.True(t, dec.waitJob(5, 3*time.Second).Success)
	require.True(t, prod.waitJob(1, 3*time.Second).Success)

	path := dec.Stats().DataPaths // the in-memory test transport: one path
	in := dec.Stats().Paths[path]
	assert.EqualValues(t, 1, in.Loads)
	assert.EqualValues(t, 4*rowLen, in.BytesIn)
	assert.Zero(t, in.LoadFailures)
	out := prod.Stats().Paths[path]
	assert.EqualValues(t, 1, out.Stores)
	assert.EqualValues(t, 4*rowLen, out.BytesOut)
	assert.EqualValues(t, 1, histogramCount(dec.Stats().LoadSeconds["ok"]))
	assert.Zero(t, histogramCount(dec.Stats().LoadSeconds["failed"]))
	assert.Len(t, dec.Stats().LoadSeconds["ok"].Counts, len(tier.LoadSecondsBuckets)+1)

	// A P2P lookup's round trip.
	held := map[string]int{string(key(30)): 5}
	prod.fill(5, key(30))
	_, err = dec.StartRequest("d2", p2pParams("kv-rtt", prod))
	require.NoError(t, err)
	var next int64 = 100
	servedUntilHit := func(req string) { // the producer's host serves, the consumer's steps ask
		require.Eventually(t, func() bool {
			prod.serve(held, &next)
			r := dec.lookup(req, keys(30))
			_ = dec.OnScheduleEnd()
			return r[0] == tier.Hit
		}, 5*time.Second, 2*time.Millisecond)
	}
	servedUntilHit("d2")
	rtt := dec.Stats().LookupRTT
	assert.GreaterOrEqual(t, histogramCount(rtt), int64(1))
	assert.Positive(t, histogramSum(rtt))
	served := prod.Stats().LookupServed
	assert.EqualValues(t, 1, histogramCount(served), "the producer answered one lookup")
	assert.Positive(t, histogramSum(served))
	assert.LessOrEqual(t, histogramSum(served), histogramSum(rtt), "held within the consumer's round trip")

	// A producer whose host gets to the lookup late: the time it was held.
	_, err = dec.StartRequest("d3", p2pParams("kv-held", prod))
	require.NoError(t, err)
	require.Equal(t, []tier.LookupResult{tier.Retry}, dec.lookup("d3", keys(30)))
	require.NoError(t, dec.OnScheduleEnd())
	require.Eventually(t, func() bool { return prod.Stats().InboundQueued > 0 }, 5*time.Second, time.Millisecond)
	const late = 40 * time.Millisecond
	time.Sleep(late)
	servedUntilHit("d3")
	now := prod.Stats().LookupServed
	assert.EqualValues(t, 2, histogramCount(now))
	assert.GreaterOrEqual(t, histogramSum(now)-histogramSum(served), late.Seconds())
	require.NoError(t, dec.FinishRequest("d3"))
	require.NoError(t, dec.FinishRequest("d2"))
	require.NoError(t, dec.FinishRequest("d"))
	require.NoError(t, prod.FinishRequest("p"))
}

// fallbackData stands for multipath having served a peer on a slower
// path than one it offered.
type fallbackData struct{ data.Transport }

func (fallbackData) PathTo(string) string  { return "tcp" }
func (fallbackData) Refused(string) string { return "shm: no such local socket" }

func TestFallbacksToASlowerPathAreCounted(t *testing.T) {
	c := newCluster(t)
	mk := func(n int) *node {
		cfg := fastConfig(n)
		region := data.Region{Mem: make([]byte, numRows*rowLen), RowLen: rowLen}
		id := cfg.LocalID()
		tr, err := tier.New(cfg, region, tier.Deps{
			Control: c.ctl.Transport(id),
			NewData: func(guard data.WriteGuard, _ tier.Logf) (data.Transport, error) {
				return fallbackData{c.data.Transport(id, region, guard)}, nil
			},
		})
		require.NoError(t, err)
		tr.WaitForTheLock() // single calls' answers are asserted (hostgate.go)
		t.Cleanup(func() { _ = tr.Shutdown() })
		return &node{Tier: tr, t: t, id: id, region: region, seen: map[int64]tier.JobResult{}}
	}
	prod, dec := mk(1), mk(2)
	_, err := dec.StartRequest("d", pdParams("kv-fb", prod))
	require.NoError(t, err)
	require.NoError(t, dec.SubmitLoad("d", 1, keys(1), []int64{0}))
	require.Eventually(t, func() bool {
		return dec.Stats().Paths["tcp"].Fallbacks == 1 && prod.Stats().Paths["tcp"].Fallbacks == 1
	}, 3*time.Second, 5*time.Millisecond, "%+v %+v", dec.Stats().Paths, prod.Stats().Paths)
	require.NoError(t, dec.FinishRequest("d"))
}

// Every label value is from a fixed set: nothing per request or per peer.
func TestMetricLabelsAreBounded(t *testing.T) {
	c := newCluster(t)
	prod := c.node(1, func(cfg *config.Config) { cfg.HashSeed = "other" })
	for i := range 5 {
		cons := c.node(10 + i)
		_, err := cons.StartRequest("c", p2pParams("kv-many", prod))
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			r := cons.lookup("c", keys(1))
			_ = cons.OnScheduleEnd()
			return r[0] == tier.Miss
		}, 10*time.Second, 5*time.Millisecond)
	}
	require.Eventually(t, func() bool { return prod.Stats().HandshakeRejections["hash_seed"] == 5 }, 3*time.Second, 5*time.Millisecond)
	for cause := range prod.Stats().HandshakeRejections {
		assert.Contains(t, tier.RejectionCauses, cause)
	}
	assert.Len(t, prod.Stats().HandshakeRejections, 1, "five peers, one series")
}

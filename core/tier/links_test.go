package tier_test

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/tier"
)

// Real pulls between two tiers fill the consumer's link entry for its
// source: round trips, setup, a pull model from the fetches, no failures.
func TestRealPullsFillThePeersLink(t *testing.T) {
	c := newCluster(t)
	prod, cons := c.node(1), c.node(2)

	// P2P pulls of 1, 2 and 4 rows: lookups (timed), then a fetch each.
	var pins int64 = 1000
	row := 0
	for n, size := range []int{1, 2, 4} {
		ks := make([][]byte, size+1)
		held := map[string]int{}
		dst := make([]int64, size)
		for i := range ks {
			ks[i] = key(100*n + i)
			if i < size { // the last key is a miss: the prefix ends
				prod.fill(row, ks[i])
				held[string(ks[i])] = row
				dst[i] = int64(row + 20)
				row++
			}
		}
		req := fmt.Sprintf("s%d", n)
		_, err := cons.StartRequest(req, p2pParams("kv-link-"+req, prod))
		require.NoError(t, err)
		require.Eventually(t, func() bool {
			r := cons.lookup(req, ks)
			_ = cons.OnScheduleEnd()
			prod.serve(held, &pins)
			return r[size] == tier.Miss && r[0] == tier.Hit
		}, 5*time.Second, 2*time.Millisecond)
		require.NoError(t, cons.SubmitLoad(req, int64(20+n), ks[:size], dst))
		require.True(t, cons.waitJob(int64(20+n), 5*time.Second).Success)
		require.NoError(t, cons.FinishRequest(req))
	}

	v := peerView(cons.Stats(), prod.id)
	require.NotNil(t, v)
	l := v.Link
	assert.Positive(t, l.SetupS, "dial until the handshake finished")
	assert.Less(t, l.SetupS, v.AgeSeconds)
	assert.Positive(t, l.RTTSamples)
	assert.Positive(t, l.RTTP50)
	assert.GreaterOrEqual(t, l.RTTP99, l.RTTP50)
	assert.Equal(t, 3, l.Samples, "one sample per completed fetch")
	assert.Positive(t, l.BytesPerS)
	assert.Positive(t, l.ThroughputBytesPerS)
	assert.GreaterOrEqual(t, l.T0, 0.0)
	assert.GreaterOrEqual(t, l.AgeS, 0.0)
	assert.Less(t, l.AgeS, 60.0)
	assert.Equal(t, map[string]int64{"transfer": 0, "aborted": 0, "bad_frame": 0}, l.Failures)

	// The producer pulled nothing: no model, but its own setup.
	pv := peerView(prod.Stats(), cons.id)
	require.NotNil(t, pv)
	assert.Zero(t, pv.Link.Samples)
	assert.Positive(t, pv.Link.SetupS)

	// The JSON a host reads: "link" in each peer entry.
	raw, err := json.Marshal(cons.Stats())
	require.NoError(t, err)
	var doc struct {
		Peers []struct {
			Link map[string]any `json:"link"`
		} `json:"peers"`
	}
	require.NoError(t, json.Unmarshal(raw, &doc))
	require.Len(t, doc.Peers, 1)
	for _, k := range []string{"rtt_p50_s", "rtt_p99_s", "rtt_samples", "setup_s", "pull_t0_s", "pull_bytes_per_s",
		"pull_samples", "pull_age_s", "throughput_bytes_per_s", "failures"} {
		assert.Contains(t, doc.Peers[0].Link, k)
	}
}

// A failed fetch is counted against its peer by cause.
func TestAFailedFetchIsCountedByCause(t *testing.T) {
	c := newCluster(t)
	prod := c.node(1, func(cfg *config.Config) { cfg.UnboundStoreTimeout = 100 * time.Millisecond })
	dec := c.node(2, func(cfg *config.Config) { cfg.LoadTimeout = 300 * time.Millisecond })
	_, err := dec.StartRequest("d", pdParams("kv-link-fail", prod))
	require.NoError(t, err)
	require.NoError(t, dec.SubmitLoad("d", 7, keys(1), []int64{1}))
	assert.False(t, dec.waitJob(7, 10*time.Second).Success)

	v := peerView(dec.Stats(), prod.id)
	require.NotNil(t, v)
	f := v.Link.Failures
	assert.EqualValues(t, 1, f["transfer"]+f["aborted"], "%v", f)
	assert.Zero(t, v.Link.Samples, "a failed fetch is not a pull-cost sample")
	require.NoError(t, dec.FinishRequest("d"))
}

package tier_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/control"
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/tier"
)

// restartSilently replaces old with a new start of the same peer after a
// crash nobody saw (no goodbye, no connection loss reported to its peers).
func (c *cluster) restartSilently(old *node, cfg config.Config) *node {
	region := data.Region{Mem: make([]byte, numRows*rowLen), RowLen: rowLen}
	tr, err := tier.New(cfg, region, tier.Deps{
		Control: c.ctl.RestartSilently(old.id),
		NewData: func(guard data.WriteGuard, _ tier.Logf) (data.Transport, error) {
			return c.data.Transport(old.id, region, guard), nil
		},
	})
	require.NoError(c.t, err)
	tr.WaitForTheLock() // single calls' answers are asserted (hostgate.go)
	_ = old.Shutdown()  // its transport is gone: nothing it says reaches anyone
	p := &node{Tier: tr, t: c.t, id: old.id, region: region, seen: map[int64]tier.JobResult{}}
	c.t.Cleanup(func() { _ = tr.Shutdown() })
	return p
}

// pullPDOnce has dec pull four rows of a fresh kv id from prod and returns the
// load's report.
func pullPDOnce(t *testing.T, prod, dec *node, kv string, job int64, within time.Duration) tier.JobResult {
	t.Helper()
	ks := keys(int(job)*4, int(job)*4+1, int(job)*4+2, int(job)*4+3)
	_, err := prod.StartRequest("p-"+kv, []byte(fmt.Sprintf(`{"remote_decoder":{"kv_request_id":%q}}`, kv)))
	require.NoError(t, err)
	for i, k := range ks {
		prod.fill(10+i, k)
	}
	require.NoError(t, prod.SubmitStore("p-"+kv, 1000+job, ks, []int64{10, 11, 12, 13}))
	require.NoError(t, prod.FinishRequest("p-"+kv))
	_, err = dec.StartRequest("d-"+kv, pdParams(kv, prod))
	require.NoError(t, err)
	dec.lookup("d-"+kv, ks)
	require.NoError(t, dec.SubmitLoad("d-"+kv, job, ks, []int64{40, 41, 42, 43}))
	res := dec.waitJob(job, within)
	require.NoError(t, dec.FinishRequest("d-"+kv))
	return res
}

// A consumer restarted on the same address after a crash its producer never
// saw: its first pull succeeds, within a quarter of the handshake timeout,
// with and without a cluster secret (the producer ends the old incarnation's
// session at once instead of refusing the new connect as a duplicate), trial
// after trial; every job is reported once.
func TestRestartedConsumerIsServedAtOnce(t *testing.T) {
	for _, secret := range []string{"", "cluster secret"} {
		t.Run(map[string]string{"": "plain", "cluster secret": "secret"}[secret], func(t *testing.T) {
			const trials = 5
			c := newCluster(t)
			withTimeouts := func(cfg *config.Config) {
				cfg.HandshakeTimeout = 8 * time.Second
				cfg.AuthSecret = secret
			}
			prod := c.node(1, withTimeouts)
			decCfg := fastConfig(2)
			withTimeouts(&decCfg)
			dec := c.node(2, withTimeouts)
			bound := decCfg.HandshakeTimeout / 4
			require.True(t, pullPDOnce(t, prod, dec, "kv-first", 1, bound).Success)
			var logs strings.Builder
			for i := range trials {
				dec = c.restartSilently(dec, decCfg)
				start := time.Now()
				res := pullPDOnce(t, prod, dec, fmt.Sprintf("kv-restart-%d", i), int64(i+2), bound)
				logs.Write(prod.TakeLogs(1 << 20))
				assert.True(t, res.Success, "trial %d: the restarted consumer's first pull failed; producer: %s", i, &logs)
				t.Logf("trial %d: first pull after the restart took %v", i, time.Since(start).Round(time.Millisecond))
				prod.collect()
			}
			assert.Contains(t, logs.String(), "restarted (epoch")
			assert.NotContains(t, logs.String(), "duplicate connect")
			assert.EqualValues(t, trials, prod.Stats().PeerRestarts, "each restart counted once")
			assertQuiet(t, prod, dec)
		})
	}
}

// redialSpy records the tier's requests for a fresh control connection.
type redialSpy struct {
	control.Transport
	redials chan string
}

func (r *redialSpy) Redial(peerID string) { r.redials <- peerID }

// A handshake that timed out leaves no connection to take back: the tier
// asks its transport for a fresh dial (zmqctl would otherwise hand the next
// request the same connection, one the peer may never read), and the next
// request is served.
func TestHandshakeTimeoutDialsAfresh(t *testing.T) {
	c := newCluster(t)
	prod := c.node(1)
	cfg := fastConfig(2)
	cfg.HandshakeTimeout = 300 * time.Millisecond
	region := data.Region{Mem: make([]byte, numRows*rowLen), RowLen: rowLen}
	spy := &redialSpy{Transport: c.ctl.Transport(cfg.LocalID()), redials: make(chan string, 16)}
	tr, err := tier.New(cfg, region, tier.Deps{
		Control: spy,
		NewData: func(guard data.WriteGuard, _ tier.Logf) (data.Transport, error) {
			return c.data.Transport(cfg.LocalID(), region, guard), nil
		},
	})
	require.NoError(t, err)
	tr.WaitForTheLock() // single calls' answers are asserted (hostgate.go)
	t.Cleanup(func() { _ = tr.Shutdown() })
	dec := &node{Tier: tr, t: t, id: cfg.LocalID(), region: region, seen: map[int64]tier.JobResult{}}

	c.ctl.SetDrop(prod.id, dec.id, true) // the producer's answers never arrive
	res := pullPDOnce(t, prod, dec, "kv-lost", 1, 5*time.Second)
	assert.False(t, res.Success)
	select {
	case id := <-spy.redials:
		assert.Equal(t, prod.id, id)
	case <-time.After(5 * time.Second):
		t.Fatal("no fresh dial asked after the handshake timed out")
	}
	c.ctl.SetDrop(prod.id, dec.id, false)
	// The timed-out peer is backed off (unreachable.go): requests in that
	// window are served locally; the next one after it dials afresh.
	time.Sleep(tier.FirstConnectBackoff + 200*time.Millisecond)
	assert.True(t, pullPDOnce(t, prod, dec, "kv-after", 2, 5*time.Second).Success)
}

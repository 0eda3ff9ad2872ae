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

func TestProbeOfAMatchingPeerHandshakesAndLeavesItServing(t *testing.T) {
	r := newMultiRig(t, 1)
	r.srcs[0].hold(0, 1)
	doctor := r.c.node(9)
	res, err := doctor.Probe(r.srcs[0].id, 3*time.Second)
	require.NoError(t, err)
	assert.True(t, res.Handshake, "%+v", res)
	require.NotNil(t, res.Connect)
	assert.Equal(t, uint64(rowLen), res.Connect.BlockLen)
	assert.Equal(t, "42", res.Connect.HashSeed)
	assert.True(t, res.Connect.PeerKV)
	assert.Positive(t, res.RTTms)
	assert.Empty(t, res.Refused)
	// The probed peer still serves a real consumer.
	_, err = r.cons.StartRequest("c", urls(r.srcs[0]))
	require.NoError(t, err)
	assert.Equal(t, []tier.LookupResult{tier.Hit, tier.Hit}, r.lookupSettled("c", keys(0, 1), 3*time.Second))
	r.finish("c")
	require.Eventually(t, func() bool { return r.srcs[0].Stats().Sessions == 1 }, 3*time.Second, 5*time.Millisecond,
		"the probe's session ended at the probed peer")
}

func TestProbeNamesTheFieldsAPeerKVPeerRefused(t *testing.T) {
	c := newCluster(t)
	prod := c.node(1)
	doctor := c.node(2, func(cfg *config.Config) { cfg.HashSeed = "not the cluster's" })
	res, err := doctor.Probe(prod.id, 3*time.Second)
	require.NoError(t, err)
	assert.False(t, res.Handshake)
	assert.Equal(t, []string{"hash_seed"}, res.Refused)
	assert.Nil(t, res.Connect, "a peerkv peer tells a refused stranger no values")
	assert.Contains(t, res.Reason, "hash_seed")
	// The probed peer says why at INFO, as a probe's, and counts no rejection.
	assertProbeLoggedAtInfo(t, prod, doctor.id, "hash seed mismatch")
	assert.Zero(t, prod.Stats().HandshakeRejections["hash_seed"])
}

// A probe that does not know the peer's block_len learns it from the
// peer's connect, sent before the refusal that names block_len; the peer
// logs it at INFO and counts no rejection.
func TestProbeLearnsThePeersBlockLen(t *testing.T) {
	c := newCluster(t)
	prod := c.node(1)
	doctor := c.nodeWithRowLen(2, 2*rowLen)
	res, err := doctor.Probe(prod.id, 3*time.Second)
	require.NoError(t, err)
	assert.False(t, res.Handshake)
	require.NotNil(t, res.Connect, "%+v", res)
	assert.Equal(t, uint64(rowLen), res.Connect.BlockLen)
	assertProbeLoggedAtInfo(t, prod, doctor.id, "block_len")
	for cause, n := range prod.Stats().HandshakeRejections {
		assert.Zero(t, n, cause)
	}

	// With it, the second probe completes.
	again, err := c.nodeWithRowLen(3, rowLen).Probe(prod.id, 3*time.Second)
	require.NoError(t, err)
	assert.True(t, again.Handshake, "%+v", again)
}

// An ordinary peer that gives another block_len is still refused before it
// learns anything, at ERROR, and counted.
func TestANonProbePeerLearnsNoBlockLen(t *testing.T) {
	c := newCluster(t)
	prod := c.node(1)
	cons := c.nodeWithRowLen(2, 2*rowLen)
	_, err := cons.StartRequest("r", sourceParams("remote_kv_source", "kv-r", prod))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return prod.Stats().HandshakeRejections["block_len"] == 1 },
		3*time.Second, 5*time.Millisecond)
	assert.Contains(t, string(prod.TakeLogs(1<<20)), "ERROR rejecting peer "+cons.id+": block_len mismatch")
}

// assertProbeLoggedAtInfo: the probed peer's lines about the probe are
// INFO, one of them names why, and none is an ERROR.
func assertProbeLoggedAtInfo(t *testing.T, probed *node, prober, why string) {
	t.Helper()
	var logs string
	require.Eventually(t, func() bool {
		logs += string(probed.TakeLogs(1 << 20))
		return strings.Contains(logs, "INFO rejecting probe "+prober+" (peerkv doctor)") && strings.Contains(logs, why)
	}, 3*time.Second, 5*time.Millisecond, "%s", logs)
	assert.Contains(t, logs, "INFO probe "+prober+" (peerkv doctor) connected: handshake only")
	assert.NotContains(t, logs, "ERROR", "a probe is no engine's problem")
}

// nodeWithRowLen is cluster.node with rows of another length.
func (c *cluster) nodeWithRowLen(n int, rl uint64) *node {
	cfg := fastConfig(n)
	region := data.Region{Mem: make([]byte, numRows*rl), RowLen: rl}
	id := cfg.LocalID()
	tr, err := tier.New(cfg, region, tier.Deps{
		Control: c.ctl.Transport(id),
		NewData: func(guard data.WriteGuard, _ tier.Logf) (data.Transport, error) {
			return c.data.Transport(id, region, guard), nil
		},
	})
	require.NoError(c.t, err)
	tr.WaitForTheLock() // single calls' answers are asserted (hostgate.go)
	c.t.Cleanup(func() { _ = tr.Shutdown() })
	return &node{Tier: tr, t: c.t, id: id, region: region, seen: map[int64]tier.JobResult{}}
}

package tier_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/tier"
)

func TestProbeOfAMatchingPeerHandshakesAndLeavesItServing(t *testing.T) {
	r := newMultiRig(t, 1)
	r.srcs[0].hold(0, 1)
	doctor := r.c.peer(9)
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
	prod := c.peer(1)
	doctor := c.peer(2, func(cfg *config.Config) { cfg.HashSeed = "not the cluster's" })
	res, err := doctor.Probe(prod.id, 3*time.Second)
	require.NoError(t, err)
	assert.False(t, res.Handshake)
	assert.Equal(t, []string{"hash_seed"}, res.Refused)
	assert.Nil(t, res.Connect, "a peerkv peer tells a refused stranger no values")
	assert.Contains(t, res.Reason, "hash_seed")
	assert.EqualValues(t, 1, prod.Stats().HandshakeRejections["hash_seed"])
}

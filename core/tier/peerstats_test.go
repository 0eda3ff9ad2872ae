package tier_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/tier"
)

// peerView is s's entry for the peer id, or nil.
func peerView(s tier.Stats, id string) *tier.PeerStats {
	for i := range s.Peers {
		if s.Peers[i].Peer == id {
			return &s.Peers[i]
		}
	}
	return nil
}

// Each side sees the other as one entry: what it pulled or served, its
// lookups, their answers and round trips, and its data path; the entry goes
// when the session does.
func TestEachLivePeerHasItsOwnView(t *testing.T) {
	c := newCluster(t)
	prod, cons := c.node(1), c.node(2)
	ks := keys(40, 41, 42)
	_, err := prod.StartRequest("p", []byte(`{"remote_decoder":{"kv_request_id":"kv-peer"}}`))
	require.NoError(t, err)
	for i, k := range ks {
		prod.fill(i, k)
	}
	require.NoError(t, prod.SubmitStore("p", 1, ks, []int64{0, 1, 2}))
	_, err = cons.StartRequest("d", pdParams("kv-peer", prod))
	require.NoError(t, err)
	require.NoError(t, cons.SubmitLoad("d", 5, ks, []int64{20, 21, 22}))
	require.True(t, cons.waitJob(5, 3*time.Second).Success)
	require.True(t, prod.waitJob(1, 3*time.Second).Success)

	// A P2P lookup: one key the producer holds, one it does not.
	held := map[string]int{string(key(50)): 5}
	prod.fill(5, key(50))
	_, err = cons.StartRequest("s", p2pParams("kv-peer-p2p", prod))
	require.NoError(t, err)
	var next int64 = 100
	require.Eventually(t, func() bool {
		prod.serve(held, &next)
		r := cons.lookup("s", keys(50, 51))
		_ = cons.OnScheduleEnd()
		return r[0] == tier.Hit && r[1] == tier.Miss
	}, 5*time.Second, 2*time.Millisecond)

	st := cons.Stats()
	require.Len(t, st.Peers, 1, "one live session, one entry: %+v", st.Peers)
	v := st.Peers[0]
	assert.Equal(t, prod.id, v.Peer)
	assert.Equal(t, st.DataPaths, v.DataPath, "the path the peer was registered on")
	assert.True(t, v.Handshaked)
	assert.True(t, v.Dialed, "the consumer dialed its source")
	assert.Positive(t, v.AgeSeconds)
	assert.EqualValues(t, 1, v.LoadsOK)
	assert.Zero(t, v.LoadsFailed)
	assert.EqualValues(t, 3*rowLen, v.BytesIn)
	assert.GreaterOrEqual(t, v.LookupsSent, int64(1))
	assert.GreaterOrEqual(t, v.LookupsAnswered, int64(1))
	assert.LessOrEqual(t, v.LookupsAnswered, v.LookupsSent)
	assert.GreaterOrEqual(t, v.LookupHits, int64(1))
	assert.GreaterOrEqual(t, v.LookupMisses, int64(1))
	assert.Positive(t, v.LastLookupRTT)
	assert.Equal(t, v.LookupsAnswered, histogramCount(v.LookupRTT))
	assert.Empty(t, v.LastError)

	out := peerView(prod.Stats(), cons.id)
	require.NotNil(t, out, "the producer's view of its consumer")
	assert.EqualValues(t, 3*rowLen, out.BytesOut)
	assert.False(t, out.Dialed)

	// The JSON a host reads: one object per peer under "peers".
	var doc struct {
		Peers []map[string]any `json:"peers"`
	}
	raw, err := json.Marshal(st)
	require.NoError(t, err)
	require.NoError(t, json.Unmarshal(raw, &doc))
	require.Len(t, doc.Peers, 1)
	for _, k := range []string{"peer", "data_path", "age_s", "lookups_sent", "lookups_answered", "lookup_hits",
		"lookup_misses", "loads_ok", "loads_failed", "bytes_in", "bytes_out", "last_lookup_rtt_s", "lookup_rtt_s"} {
		assert.Contains(t, doc.Peers[0], k)
	}

	require.NoError(t, cons.FinishRequest("s"))
	require.NoError(t, cons.FinishRequest("d"))
	require.NoError(t, prod.FinishRequest("p"))
	require.NoError(t, prod.Shutdown())
	require.Eventually(t, func() bool { return len(cons.Stats().Peers) == 0 }, 3*time.Second, 5*time.Millisecond,
		"a peer that went leaves the view")
}

// A failed load is counted against the peer it was pulled from, with what
// went wrong.
func TestAFailedLoadIsChargedToItsPeer(t *testing.T) {
	c := newCluster(t)
	prod := c.node(1, func(cfg *config.Config) { cfg.UnboundStoreTimeout = 100 * time.Millisecond })
	dec := c.node(2, func(cfg *config.Config) { cfg.LoadTimeout = 300 * time.Millisecond })
	_, err := dec.StartRequest("d", pdParams("kv-peer-fail", prod))
	require.NoError(t, err)
	// Nothing was ever stored for the kv id: the load fails.
	require.NoError(t, dec.SubmitLoad("d", 7, keys(1), []int64{1}))
	assert.False(t, dec.waitJob(7, 10*time.Second).Success)

	v := peerView(dec.Stats(), prod.id)
	require.NotNil(t, v)
	assert.EqualValues(t, 1, v.LoadsFailed)
	assert.Zero(t, v.LoadsOK)
	assert.Zero(t, v.BytesIn)
	assert.Contains(t, v.LastError, "kv-peer-fail")
	assert.GreaterOrEqual(t, v.LastErrorAge, 0.0)
	require.NoError(t, dec.FinishRequest("d"))
}

// The view never holds more entries than there are sessions.
func TestThePeerViewIsBoundedBySessions(t *testing.T) {
	c := newCluster(t)
	prod := c.node(1, func(cfg *config.Config) { cfg.MaxPeers = 2 })
	var cons []*node
	for i := 2; i <= 5; i++ {
		p := c.node(i)
		_, err := p.StartRequest("s", p2pParams("kv-bound", prod))
		require.NoError(t, err)
		_ = p.lookup("s", keys(1))
		require.NoError(t, p.OnScheduleEnd())
		cons = append(cons, p)
	}
	require.Eventually(t, func() bool {
		return prod.Stats().SessionsRefused+prod.Stats().SessionsEvicted > 0
	}, 5*time.Second, 5*time.Millisecond)
	for range 20 {
		st := prod.Stats()
		assert.LessOrEqual(t, len(st.Peers), 2)
		assert.Len(t, st.Peers, st.Sessions)
		time.Sleep(5 * time.Millisecond)
	}
	for _, p := range cons {
		require.NoError(t, p.FinishRequest("s"))
	}
}

// The host's stats document carries the per-peer list at most once a
// second: a host reads its stats every engine step.
func TestTheHostGetsThePeerListAtMostOnceASecond(t *testing.T) {
	c := newCluster(t)
	prod, cons := c.node(1), c.node(2)
	_, err := cons.StartRequest("s", p2pParams("kv-host-stats", prod))
	require.NoError(t, err)
	_ = cons.lookup("s", keys(1))
	require.NoError(t, cons.OnScheduleEnd())
	require.Eventually(t, func() bool { return len(cons.Stats().Peers) == 1 }, 5*time.Second, 5*time.Millisecond)

	first := cons.HostStats()
	require.Len(t, first.Peers, 1, "the first document carries the list")
	assert.Len(t, cons.HostStats().Peers, 1, "not delivered yet (a too small buffer): still due")
	cons.PeersDelivered()
	again := cons.HostStats()
	assert.Nil(t, again.Peers, "within a second of a delivered list")
	raw, err := json.Marshal(again)
	require.NoError(t, err)
	assert.Contains(t, string(raw), `"peers":null`)
	assert.Len(t, cons.Stats().Peers, 1, "Stats itself always lists them")
	require.Eventually(t, func() bool { return cons.HostStats().Peers != nil }, 5*time.Second, 20*time.Millisecond)
	require.NoError(t, cons.FinishRequest("s"))
}

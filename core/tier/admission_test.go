package tier_test

import (
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/tier"
)

// hostNode is a node whose id (and so, over memctl, its source address) is
// host:6000+n.
func (c *cluster) hostNode(n int, host string, mutate ...func(*config.Config)) *node {
	return c.node(n, append([]func(*config.Config){func(cfg *config.Config) { cfg.Host = host }}, mutate...)...)
}

// sourceParams names prod as a request's source: kind is "remote_kv_source"
// (P2P) or "remote_prefiller" (PD).
func sourceParams(kind, kv string, prod *node) []byte {
	host, port, _ := net.SplitHostPort(prod.id)
	return []byte(fmt.Sprintf(`{%q:{"kv_request_id":%q,"remote_host":%q,"remote_port":%s}}`, kind, kv, host, port))
}

func allow(entries ...string) func(*config.Config) {
	return func(cfg *config.Config) { cfg.AllowedPeers = entries }
}

// A client may name any host in kv_transfer_params: a source outside
// allowed_peers is never dialed, and the request is served locally at once
// (MISS, the load failed), counted and logged once per interval.
func TestASourceOutsideAllowedPeersIsNeverDialed(t *testing.T) {
	c := newCluster(t)
	dec := c.node(1, allow("127.0.0.0/24", "fd00::/8", "prefill-0.svc"))
	outside := c.hostNode(2, "127.0.2.1")
	inside := c.node(3)

	start := time.Now()
	for i := range 5 {
		req := fmt.Sprintf("p2p-%d", i)
		_, err := dec.StartRequest(req, sourceParams("remote_kv_source", "kv-out", outside))
		require.NoError(t, err)
		assert.Equal(t, []tier.LookupResult{tier.Miss}, dec.lookup(req, keys(1)), "served locally: MISS at once")
	}
	_, err := dec.StartRequest("pd", sourceParams("remote_prefiller", "kv-pd", outside))
	require.NoError(t, err)
	require.NoError(t, dec.SubmitLoad("pd", 1, keys(1), []int64{0}))
	assert.False(t, dec.waitJob(1, time.Second).Success, "the load fails, reported once")
	assert.Less(t, time.Since(start), time.Second, "well within the load deadline")
	for i := range 5 {
		require.NoError(t, dec.FinishRequest(fmt.Sprintf("p2p-%d", i)))
	}
	require.NoError(t, dec.FinishRequest("pd"))

	st := dec.Stats()
	assert.Equal(t, int64(6), st.HandshakeRejections[tier.CauseNotAllowed], "each refused dial is counted")
	assert.Zero(t, st.SessionsOpened)
	assert.Zero(t, outside.Stats().FramesIn, "no connect reached the host outside the list")
	logs := string(dec.TakeLogs(1 << 20))
	assert.Equal(t, 1, countLines(logs, "not dialing "+outside.id), "one line per interval:\n%s", logs)
	assert.Contains(t, logs, "its host is not in allowed_peers")
	assert.Zero(t, countLines(logs, "cannot pull from"), "no per-request warning:\n%s", logs)

	// A source inside the list is pulled from as before.
	ks := keys(7)
	inside.fill(5, ks[0])
	_, err = inside.StartRequest("p", []byte(`{"remote_decoder":{"kv_request_id":"kv-in"}}`))
	require.NoError(t, err)
	require.NoError(t, inside.SubmitStore("p", 2, ks, []int64{5}))
	_, err = dec.StartRequest("d", sourceParams("remote_prefiller", "kv-in", inside))
	require.NoError(t, err)
	require.NoError(t, dec.SubmitLoad("d", 3, ks, []int64{9}))
	require.True(t, dec.waitJob(3, 3*time.Second).Success)
	assert.True(t, dec.rowEquals(9, inside, 5))
	assert.Equal(t, int64(6), dec.Stats().HandshakeRejections[tier.CauseNotAllowed])
}

// The same over IPv6: the list's prefixes match IPv6 addresses, in dials
// and in connects.
func TestAllowedPeersOverIPv6(t *testing.T) {
	c := newCluster(t)
	dec := c.hostNode(1, "fd00::1", allow("fd00::/8"))
	outside := c.hostNode(2, "2001:db8::7")
	inside := c.hostNode(3, "fd00::2", allow("fd00::/8"))
	_, err := dec.StartRequest("out", sourceParams("remote_kv_source", "kv-out", outside))
	require.NoError(t, err)
	assert.Equal(t, []tier.LookupResult{tier.Miss}, dec.lookup("out", keys(1)))
	require.NoError(t, dec.FinishRequest("out"))
	assert.Zero(t, outside.Stats().FramesIn, "no connect reached 2001:db8::7")

	ks := keys(2)
	inside.fill(1, ks[0])
	_, err = inside.StartRequest("p", []byte(`{"remote_decoder":{"kv_request_id":"kv-v6"}}`))
	require.NoError(t, err)
	require.NoError(t, inside.SubmitStore("p", 1, ks, []int64{1}))
	_, err = dec.StartRequest("d", sourceParams("remote_prefiller", "kv-v6", inside))
	require.NoError(t, err)
	require.NoError(t, dec.SubmitLoad("d", 2, ks, []int64{2}))
	require.True(t, dec.waitJob(2, 3*time.Second).Success)
	assert.True(t, dec.rowEquals(2, inside, 1))

	// 2001:db8::7 dialing inside is refused by its source address.
	_, err = outside.StartRequest("x", sourceParams("remote_prefiller", "kv-x", inside))
	require.NoError(t, err)
	require.NoError(t, outside.SubmitLoad("x", 3, ks, []int64{0}))
	assert.False(t, outside.waitJob(3, 3*time.Second).Success)
	assert.Equal(t, int64(1), inside.Stats().HandshakeRejections[tier.CauseNotAllowed])
	assert.Equal(t, int64(1), dec.Stats().HandshakeRejections[tier.CauseNotAllowed])
	for _, p := range []*node{dec, inside, outside} {
		for _, r := range []string{"d", "p", "x"} {
			require.NoError(t, p.FinishRequest(r))
		}
	}
}

// A peer that dials us is checked by its source address: a consumer
// outside the list is refused before any session opens, and fails fast.
func TestAConnectFromOutsideAllowedPeersIsRefused(t *testing.T) {
	c := newCluster(t)
	prod := c.node(1, allow("127.0.0.1"))
	stranger := c.hostNode(2, "127.0.3.1")
	ks := keys(3)
	prod.fill(0, ks[0])
	_, err := prod.StartRequest("p", []byte(`{"remote_decoder":{"kv_request_id":"kv-x"}}`))
	require.NoError(t, err)
	require.NoError(t, prod.SubmitStore("p", 1, ks, []int64{0}))
	_, err = stranger.StartRequest("d", sourceParams("remote_prefiller", "kv-x", prod))
	require.NoError(t, err)
	require.NoError(t, stranger.SubmitLoad("d", 2, ks, []int64{4}))
	assert.False(t, stranger.waitJob(2, 3*time.Second).Success)
	require.Eventually(t, func() bool { return prod.Stats().HandshakeRejections[tier.CauseNotAllowed] >= 1 },
		3*time.Second, 5*time.Millisecond)
	st := prod.Stats()
	assert.Zero(t, st.SessionsOpened)
	assert.Zero(t, st.HandshakeRejections[tier.CauseLimit])
	assert.Contains(t, string(prod.TakeLogs(1<<20)), "refusing peer "+stranger.id+" (from 127.0.3.1): its address is not in allowed_peers")
}

func TestABadAllowedPeersListIsRefusedAtCreate(t *testing.T) {
	c := newCluster(t)
	region := data.Region{Mem: make([]byte, numRows*rowLen), RowLen: rowLen}
	for i, entries := range [][]string{{"10.0.0.0/33"}, {}, {"10.0.0.1/8"}} {
		cfg := fastConfig(40 + i)
		cfg.AllowedPeers = entries
		ctl := c.ctl.Transport(cfg.LocalID())
		tr, err := tier.New(cfg, region, tier.Deps{Control: ctl,
			NewData: func(guard data.WriteGuard, _ tier.Logf) (data.Transport, error) {
				return c.data.Transport(cfg.LocalID(), region, guard), nil
			}})
		if tr != nil {
			_ = tr.Shutdown()
		}
		_ = ctl.Close()
		require.ErrorIs(t, err, tier.ErrInvalidArgument, "%q", entries)
		assert.Contains(t, err.Error(), "allowed_peers")
	}
}

// One host with four addresses in one network fills max_peers with
// sessions it keeps alive; a peer from another network still gets a slot,
// the least useful session of the crowded network giving up its own.
func TestACrowdedNetworkCannotKeepEverySlot(t *testing.T) {
	c := newCluster(t)
	limits := func(cfg *config.Config) { cfg.MaxPeers = 8; cfg.MaxPeersPerHost = 2 }
	prod := c.node(1, limits)
	var crowd []*node
	for a := range 4 {
		for n := range 2 {
			crowd = append(crowd, c.hostNode(10+2*a+n, fmt.Sprintf("127.0.1.%d", 2+a)))
		}
	}
	for i, p := range crowd {
		req := fmt.Sprintf("keepalive-%d", i)
		_, err := p.StartRequest(req, sourceParams("remote_kv_source", "kv-crowd", prod))
		require.NoError(t, err)
		p.lookup(req, keys(1))
		require.NoError(t, p.OnScheduleEnd())
	}
	require.Eventually(t, func() bool { return prod.Stats().Sessions == 8 }, 3*time.Second, 5*time.Millisecond,
		"%+v", prod.Stats())
	time.Sleep(300 * time.Millisecond) // past evictableQuiet
	// The crowd's first session has been quiet longest; the others keep
	// theirs busy with a lookup.
	for i, p := range crowd[1:] {
		p.lookup(fmt.Sprintf("keepalive-%d", i+1), keys(2))
		require.NoError(t, p.OnScheduleEnd())
	}

	// Another host of the same network is refused: it would only trade a
	// slot with its neighbours.
	same := c.hostNode(30, "127.0.1.9")
	_, err := same.StartRequest("s", sourceParams("remote_prefiller", "kv-same", prod))
	require.NoError(t, err)
	require.NoError(t, same.SubmitLoad("s", 1, keys(3), []int64{0}))
	assert.False(t, same.waitJob(1, 3*time.Second).Success)
	assert.Zero(t, prod.Stats().SessionsEvicted)

	// A peer from another network is admitted and pulls.
	legit := c.hostNode(31, "127.0.2.1")
	ks := keys(4)
	prod.fill(3, ks[0])
	_, err = prod.StartRequest("p", []byte(`{"remote_decoder":{"kv_request_id":"kv-legit"}}`))
	require.NoError(t, err)
	require.NoError(t, prod.SubmitStore("p", 2, ks, []int64{3}))
	_, err = legit.StartRequest("d", sourceParams("remote_prefiller", "kv-legit", prod))
	require.NoError(t, err)
	require.NoError(t, legit.SubmitLoad("d", 3, ks, []int64{6}))
	require.True(t, legit.waitJob(3, 3*time.Second).Success, "prod: %+v", prod.Stats())
	assert.True(t, legit.rowEquals(6, prod, 3))
	assert.Equal(t, int64(1), prod.Stats().SessionsEvicted)
	assert.LessOrEqual(t, prod.Stats().Sessions, 8)

	// The evicted session was the quiet one, and it ended cleanly.
	require.Eventually(t, func() bool { return crowd[0].Stats().SessionsClosed == 1 }, 3*time.Second, 5*time.Millisecond)
	for _, p := range crowd[1:] {
		assert.Zero(t, p.Stats().SessionsClosed, p.id)
	}
	assert.Contains(t, string(prod.TakeLogs(1<<20)), "evicted: every session slot is taken (max_peers), 8 by peers from 127.0.1.0/24")

	// A source our own request names takes a crowded network's slot too,
	// rather than the request computing locally, once the crowd has been
	// quiet for evictableQuiet.
	time.Sleep(300 * time.Millisecond)
	src := c.hostNode(32, "127.0.5.1")
	_, err = prod.StartRequest("own", sourceParams("remote_kv_source", "kv-own", src))
	require.NoError(t, err)
	assert.Equal(t, []tier.LookupResult{tier.Retry}, prod.lookup("own", keys(5)), "asked of the source, not MISS")
	assert.Equal(t, int64(2), prod.Stats().SessionsEvicted)
	require.NoError(t, prod.FinishRequest("own"))
	for i, p := range crowd {
		require.NoError(t, p.FinishRequest(fmt.Sprintf("keepalive-%d", i)))
	}
	assertQuiet(t, append(crowd, prod, legit, src)...)

	// Networks each within one address's quota never yield a slot: a
	// stranger's connects cannot churn a cluster's sessions.
	small := func(cfg *config.Config) { cfg.MaxPeers = 4; cfg.MaxPeersPerHost = 2 }
	prod2 := c.node(2, small)
	var members []*node
	for i, host := range []string{"127.0.1.2", "127.0.1.3", "127.0.6.2", "127.0.6.3"} {
		p := c.hostNode(40+i, host)
		_, err := p.StartRequest("m", sourceParams("remote_kv_source", "kv-m", prod2))
		require.NoError(t, err)
		p.lookup("m", keys(1))
		require.NoError(t, p.OnScheduleEnd())
		members = append(members, p)
	}
	require.Eventually(t, func() bool { return prod2.Stats().Sessions == 4 }, 3*time.Second, 5*time.Millisecond)
	stranger2 := c.hostNode(50, "127.0.2.1")
	_, err = stranger2.StartRequest("s", sourceParams("remote_prefiller", "kv-s", prod2))
	require.NoError(t, err)
	require.NoError(t, stranger2.SubmitLoad("s", 1, keys(2), []int64{0}))
	assert.False(t, stranger2.waitJob(1, 3*time.Second).Success, "refused: no network holds more than one address may")
	assert.Zero(t, prod2.Stats().SessionsEvicted)
	for _, p := range members {
		assert.Zero(t, p.Stats().SessionsClosed, p.id)
		require.NoError(t, p.FinishRequest("m"))
	}
	require.NoError(t, stranger2.FinishRequest("s"))
}

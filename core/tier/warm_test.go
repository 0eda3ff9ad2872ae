package tier_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
)

// A keep_warm peer is dialed at start, before any request names it, and its
// session outlives many idle timeouts near max_peers, where any other idle
// session is evicted; when the peer goes away and comes back on its
// address, it is dialed again.
func TestKeepWarmPeersAreDialedAtStartAndStayConnected(t *testing.T) {
	const idle = 50 * time.Millisecond
	c := newCluster(t)
	b := c.node(2)
	a := c.node(1, func(cfg *config.Config) {
		cfg.KeepWarm = []string{b.id}
		cfg.MaxPeers, cfg.IdleTimeout = 4, idle // idle sessions reaped from the first one on
	})
	require.Eventually(t, func() bool { return b.Stats().Sessions == 1 && a.Stats().Sessions == 1 },
		5*time.Second, 5*time.Millisecond, "a dials its keep_warm peer at start")

	// other keeps a session to a warm from its side; at a it is just idle.
	c.node(3, func(cfg *config.Config) { cfg.KeepWarm = []string{a.id} })
	require.Eventually(t, func() bool { return a.Stats().SessionsClosed >= 1 }, 5*time.Second, 5*time.Millisecond,
		"a evicts an idle session that is not one of its keep_warm peers")
	time.Sleep(10 * idle)
	st := b.Stats()
	require.Equal(t, int64(1), st.SessionsOpened, "a's warm session is the first and only one")
	require.Zero(t, st.SessionsClosed, "a's warm session outlived ten idle timeouts")

	// b goes away and comes back on its address: a dials it again.
	require.NoError(t, b.Shutdown())
	b2 := c.node(2)
	require.Eventually(t, func() bool { return b2.Stats().Sessions == 1 }, 10*time.Second, 10*time.Millisecond,
		"a dials its keep_warm peer again once it is back")
}

func TestAKeepWarmPeerThatRefusesUsIsDialedLessAndLessOften(t *testing.T) {
	c := newCluster(t)
	b := c.node(2, func(cfg *config.Config) { cfg.HashSeed = "other" })
	a := c.node(1, func(cfg *config.Config) { cfg.KeepWarm = []string{b.id} })
	require.Eventually(t, func() bool { return b.Stats().HandshakeRejections["hash_seed"] >= 1 },
		5*time.Second, 5*time.Millisecond, "a dials its keep_warm peer at start, and b refuses it")
	// One dial a second would be 7 more in 7 s; the back-off (2 s, then
	// 4 s, doubling to a minute) allows 2 at most.
	time.Sleep(7 * time.Second)
	refused := b.Stats().HandshakeRejections["hash_seed"]
	assert.GreaterOrEqual(t, refused, int64(2), "a refusing keep_warm peer is still dialed again")
	assert.LessOrEqual(t, refused, int64(3), "a refusing keep_warm peer is backed off, not dialed every second")
	assert.Contains(t, string(a.TakeLogs(1<<20)), "keep_warm peer "+b.id+": 1 dial(s) in a row ended before the session was ready; dialing it again in 2s")
}

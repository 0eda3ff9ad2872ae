package tier_test

import (
	"testing"
	"time"

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
	b := c.peer(2)
	a := c.peer(1, func(cfg *config.Config) {
		cfg.KeepWarm = []string{b.id}
		cfg.MaxPeers, cfg.IdleTimeout = 4, idle // idle sessions reaped from the first one on
	})
	require.Eventually(t, func() bool { return b.Stats().Sessions == 1 && a.Stats().Sessions == 1 },
		5*time.Second, 5*time.Millisecond, "a dials its keep_warm peer at start")

	// other keeps a session to a warm from its side; at a it is just idle.
	c.peer(3, func(cfg *config.Config) { cfg.KeepWarm = []string{a.id} })
	require.Eventually(t, func() bool { return a.Stats().SessionsClosed >= 1 }, 5*time.Second, 5*time.Millisecond,
		"a evicts an idle session that is not one of its keep_warm peers")
	time.Sleep(10 * idle)
	st := b.Stats()
	require.Equal(t, int64(1), st.SessionsOpened, "a's warm session is the first and only one")
	require.Zero(t, st.SessionsClosed, "a's warm session outlived ten idle timeouts")

	// b goes away and comes back on its address: a dials it again.
	require.NoError(t, b.Shutdown())
	b2 := c.peer(2)
	require.Eventually(t, func() bool { return b2.Stats().Sessions == 1 }, 10*time.Second, 10*time.Millisecond,
		"a dials its keep_warm peer again once it is back")
}

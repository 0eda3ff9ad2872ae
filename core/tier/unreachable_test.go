package tier_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/tier"
)

// logs gathers every line p logged so far.
func (p *node) logsSoFar(all *strings.Builder) string {
	all.Write(p.TakeLogs(1 << 20))
	return all.String()
}

// A source nothing listens at fails fast, and is then remembered: the next
// requests get MISS at once without a dial, its cause is logged once in
// words (not as a lost connection), and each failed connect is counted.
func TestAnUnreachableSourceIsBackedOffAndNamedOnce(t *testing.T) {
	c := newCluster(t)
	cons := c.node(1)
	const nobody = "127.0.0.1:6999" // no peer of the hub
	var logs strings.Builder

	_, err := cons.StartRequest("r0", p2pParamsTo("kv0", nobody))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return cons.lookup("r0", keys(1))[0] == tier.Miss }, 5*time.Second, time.Millisecond)
	require.Eventually(t, func() bool { return cons.Stats().PeerConnectFailures["refused"] == 1 }, 5*time.Second, time.Millisecond)
	opened := cons.Stats().SessionsOpened

	for i := 1; i <= 5; i++ {
		req := "r" + string(rune('0'+i))
		_, err := cons.StartRequest(req, p2pParamsTo("kv"+req, nobody))
		require.NoError(t, err)
		assert.Equal(t, tier.Miss, cons.lookup(req, keys(1))[0], "MISS at once during the back-off")
	}
	assert.Equal(t, opened, cons.Stats().SessionsOpened, "no new dial during the back-off")

	// After the back-off (1 s at first) the source is dialed again, and
	// fails again: counted, not logged again in the same episode.
	require.Eventually(t, func() bool {
		_, err := cons.StartRequest("late", p2pParamsTo("kv-late", nobody))
		require.NoError(t, err)
		require.NoError(t, cons.FinishRequest("late"))
		return cons.Stats().SessionsOpened > opened
	}, 5*time.Second, 20*time.Millisecond)
	require.Eventually(t, func() bool { return cons.Stats().PeerConnectFailures["refused"] == 2 }, 5*time.Second, time.Millisecond)

	got := cons.logsSoFar(&logs)
	assert.Equal(t, 1, strings.Count(got, "cannot connect to peer "+nobody+" (refused)"), got)
	assert.NotContains(t, got, "session closed", "a connection that never existed was not lost")
	assert.NotContains(t, got, "WARNING request", "no WARNING per request")
	for cause := range cons.Stats().PeerConnectFailures {
		assert.Contains(t, tier.ConnectFailureCauses, cause)
	}
}

// A source whose packets are dropped (it never answers our connect) holds
// no lookup beyond lookup_timeout_s from the first ask; once its handshake
// timed out, new requests to it get MISS at once; a connect from it ends
// the back-off.
func TestABlackHoledSourceMissesAtTheLookupDeadlineThenIsBackedOff(t *testing.T) {
	c := newCluster(t)
	slow := func(cfg *config.Config) {
		cfg.HandshakeTimeout = 6 * time.Second
		cfg.LookupTimeout = 500 * time.Millisecond
	}
	cons, prod := c.node(1, slow), c.node(2, slow)
	c.ctl.SetDrop(cons.id, prod.id, true)
	var logs strings.Builder

	_, err := cons.StartRequest("r0", p2pParams("kv0", prod))
	require.NoError(t, err)
	start := time.Now()
	require.Equal(t, tier.Retry, cons.lookup("r0", keys(1))[0])
	require.NoError(t, cons.OnScheduleEnd())
	require.Eventually(t, func() bool { return cons.lookup("r0", keys(1))[0] == tier.Miss }, 10*time.Second, time.Millisecond)
	waited := time.Since(start)
	t.Logf("MISS after %v (lookup_timeout_s 0.5 s, handshake_timeout_s 6 s)", waited)
	assert.Less(t, waited, 3*time.Second, "not held until the handshake's deadline")

	require.Eventually(t, func() bool { return cons.Stats().PeerConnectFailures["timeout"] == 1 }, 10*time.Second, 5*time.Millisecond)
	_, err = cons.StartRequest("r1", p2pParams("kv1", prod))
	require.NoError(t, err)
	assert.Equal(t, tier.Miss, cons.lookup("r1", keys(1))[0], "MISS at once: the source is backed off")
	got := cons.logsSoFar(&logs)
	assert.Equal(t, 1, strings.Count(got, "cannot connect to peer "+prod.id+" (timeout)"), got)

	// The source connects to us: reachable, so the back-off is over.
	_, err = prod.StartRequest("back", p2pParams("kv-back", cons))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return strings.Contains(cons.logsSoFar(&logs), "is reachable again") },
		5*time.Second, 5*time.Millisecond)
	_, err = cons.StartRequest("r2", p2pParams("kv2", prod))
	require.NoError(t, err)
	assert.Equal(t, tier.Retry, cons.lookup("r2", keys(1))[0], "asked again, not refused by the back-off")
}

// peerkv doctor's probe of a peer it cannot reach names the cause.
func TestAProbeOfAnUnreachablePeerNamesTheCause(t *testing.T) {
	c := newCluster(t)
	doc := c.node(1)
	res, err := doc.Probe("127.0.0.1:6999", 5*time.Second)
	require.NoError(t, err)
	assert.False(t, res.Handshake)
	assert.Contains(t, res.Reason, "cannot connect (refused)")
	assert.Contains(t, string(doc.TakeLogs(1<<20)), "cannot connect to peer 127.0.0.1:6999 (refused)")
}

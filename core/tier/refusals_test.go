package tier_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/protocol"
)

// stockPeer plays a stock vLLM peer whose hash seed differs from ours. A
// session of its own that gets our goodbye simply ends; a frame from us
// when it holds no session (it refused ours and dropped it) opens a new
// session, which sends its connect at once. redraws says whether each
// goodbye finds it without a session. It returns the goodbyes it got in d.
func stockPeer(t *testing.T, r *rawPeer, us string, d time.Duration, redraws bool) int {
	t.Helper()
	connect := func() { r.connectWithSeed(us, "not ours") }
	goodbyes := 0
	deadline := time.After(d)
	for {
		m, ok := r.next(deadline)
		if !ok {
			return goodbyes
		}
		switch m.(type) {
		case *protocol.Connect: // we dialed it: its session answers with its connect
			connect()
		case *protocol.Disconnect:
			goodbyes++
			if redraws {
				connect()
			}
		}
	}
}

func TestAStockProducerWeRefuseIsRefusedWithOneGoodbyeNotAStorm(t *testing.T) {
	c := newCluster(t)
	p := c.node(1)
	y := c.raw("127.0.0.1:7996")
	_, err := p.StartRequest("c", p2pParamsTo("kv-storm", y.id))
	require.NoError(t, err)
	p.lookup("c", keys(1)) // dials y
	_ = p.OnScheduleEnd()

	assert.Equal(t, 1, stockPeer(t, y, p.id, 500*time.Millisecond, true),
		"our refusal says goodbye; the connect that goodbye drew from y's new session is refused silently")
	logs := string(p.TakeLogs(1 << 16))
	assert.Equal(t, 2, strings.Count(logs, "hash seed mismatch"), logs)
	assert.Zero(t, p.Stats().Sessions)
}

func TestAStockConsumerWeRefuseGetsAGoodbyeEveryTime(t *testing.T) {
	c := newCluster(t)
	p := c.node(1)
	v := c.raw("127.0.0.1:7995")
	for range 3 { // three requests, well inside quietRefusalWindow
		v.connectWithSeed(p.id, "not ours")
		assert.Equal(t, 1, stockPeer(t, v, p.id, 300*time.Millisecond, false), "each request of a stock consumer fails fast")
	}
}

// full makes p turn away any further connect from 127.0.0.3: one stranger
// from there holds the one slot that host has, its handshake unfinished.
func full(c *cluster) *node { return fullFrom(c, "127.0.0.3") }

func fullFrom(c *cluster, host string) *node {
	p := c.node(1, func(cfg *config.Config) { cfg.MaxPeersPerHost = 1; cfg.HandshakeTimeout = 30 * time.Second })
	c.raw(host + ":7001").connect(p.id)
	require.Eventually(c.t, func() bool { return p.Stats().Sessions == 1 }, 3*time.Second, time.Millisecond)
	return p
}

// A stock peer that dials us and is refused, in the worst case: every
// goodbye finds it without a session and draws a new connect, which is
// refused too.
func TestAStockPeerThatDialsUsAndIsRefusedGetsPacedGoodbyesNotAStorm(t *testing.T) {
	for name, tc := range map[string]struct {
		node func(*cluster) *node
		seed string
	}{
		"while we are full": {full, "42"},
		"hash seed":         {func(c *cluster) *node { return c.node(1) }, "not ours"},
		"auth secret":       {func(c *cluster) *node { return c.node(1, func(cfg *config.Config) { cfg.AuthSecret = "s" }) }, "42"},
	} {
		t.Run(name, func(t *testing.T) {
			c := newCluster(t)
			p := tc.node(c)
			sessions := p.Stats().Sessions
			y := c.raw("127.0.0.3:7994")
			y.connectWithSeed(p.id, tc.seed)
			goodbyes := stockPeer(t, y, p.id, time.Second, true)
			assert.GreaterOrEqual(t, goodbyes, 2, "a refused stock peer still hears why")
			assert.LessOrEqual(t, goodbyes, 6, "one goodbye per pace at most, not one per round trip")
			assert.Equal(t, sessions, p.Stats().Sessions, "nothing else changed")
		})
	}
}

// twoConnectsInsideOnePace is two requests of stock peer r refused inside
// one pace: the second one's goodbye is owed.
func twoConnectsInsideOnePace(r *rawPeer, to string) {
	r.connectWithSeed(to, "42")
	time.Sleep(20 * time.Millisecond)
	r.connectWithSeed(to, "42")
	time.Sleep(20 * time.Millisecond)
}

func TestAStockConsumerRefusedWhileWeAreFullHearsItForEachRequest(t *testing.T) {
	c := newCluster(t)
	p := full(c)
	v := c.raw("127.0.0.3:7993")
	// A stock consumer waits for the ack with no deadline, so the second
	// request must get its goodbye too (paced), or it would hang.
	twoConnectsInsideOnePace(v, p.id)
	assert.Equal(t, 2, stockPeer(t, v, p.id, time.Second, false))
}

// The goodbyes a shutdown finds owed go out with its own.
func TestShutdownSendsTheGoodbyesItOwes(t *testing.T) {
	c := newCluster(t)
	p := full(c)
	v := c.raw("127.0.0.3:7993")
	twoConnectsInsideOnePace(v, p.id)
	require.NoError(t, p.Shutdown())
	assert.Equal(t, 2, stockPeer(t, v, p.id, 300*time.Millisecond, false), "each waiting request hears it")
}

// A goodbye owed to a stock peer goes before our own dial to it, which
// would otherwise cancel it and leave the peer's request waiting.
func TestAnOwedGoodbyeGoesBeforeOurDial(t *testing.T) {
	c := newCluster(t)
	p := fullFrom(c, "127.0.0.1") // where p2pParamsTo's sources live
	y := c.raw("127.0.0.1:7992")
	twoConnectsInsideOnePace(y, p.id)
	_, err := p.StartRequest("c", p2pParamsTo("kv-owed", y.id))
	require.NoError(t, err)
	p.lookup("c", keys(1)) // dials y
	_ = p.OnScheduleEnd()

	var got []protocol.Type
	deadline := time.After(500 * time.Millisecond)
	for len(got) < 3 {
		m, ok := y.next(deadline)
		require.True(t, ok, "got %v; %s", got, p.TakeLogs(1<<16))
		got = append(got, m.MsgType())
	}
	assert.Equal(t, []protocol.Type{protocol.TypeDisconnect, protocol.TypeDisconnect, protocol.TypeConnect}, got)
}

package tier_test

import (
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/protocol"
	"github.com/peerkv/peerkv/core/tier"
)

func countLines(logs, about string) int {
	n := 0
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, about) {
			n++
		}
	}
	return n
}

// A stranger's flood of one kind of frame yields a bounded number of log
// lines, then one that counts what was suppressed; another cause still logs
// in the meantime. Before, every dropped frame was a WARNING line.
func TestAFloodOfOneCauseIsRateLimitedAndOthersStillLog(t *testing.T) {
	c := newCluster(t)
	var skew atomic.Int64 // how far the peer's clock is ahead
	cfg := fastConfig(1)
	region := data.Region{Mem: make([]byte, numRows*rowLen), RowLen: rowLen}
	id := cfg.LocalID()
	p, err := tier.New(cfg, region, tier.Deps{
		Control: c.ctl.Transport(id),
		NewData: func(guard data.WriteGuard, _ tier.Logf) (data.Transport, error) {
			return c.data.Transport(id, region, guard), nil
		},
		Now: func() time.Time { return time.Now().Add(time.Duration(skew.Load())) },
	})
	require.NoError(t, err)
	p.WaitForTheLock() // single calls' answers are asserted (hostgate.go)
	t.Cleanup(func() { _ = p.Shutdown() })

	const flood = 500
	const dropped = "which has no session"
	stranger := c.raw("127.0.0.1:7401")
	frame := mustEncode(t, &protocol.Lookup{KVRequestID: "x", Keys: keys(1)})
	for range flood {
		require.NoError(t, stranger.tr.Send(id, frame))
	}
	require.Eventually(t, func() bool { return p.Stats().DroppedFrames == flood }, 5*time.Second, time.Millisecond)
	logs := string(p.TakeLogs(1 << 20))
	n := countLines(logs, dropped)
	t.Logf("%d frames dropped, %d lines logged for them", flood, n)
	assert.Positive(t, n, "the first dropped frames are logged")
	assert.LessOrEqual(t, n, 10, "a flood of dropped frames logs at most a few lines per cause")

	// Another cause is not silenced by the flood.
	c.raw("127.0.0.1:7402").connectWithSeed(id, "not-ours")
	require.Eventually(t, func() bool {
		logs += string(p.TakeLogs(1 << 20))
		return strings.Contains(logs, "hash seed mismatch")
	}, 3*time.Second, time.Millisecond, "a refused connect was not logged during the flood")

	// Once the window is over, one line counts what was suppressed.
	skew.Store(int64(11 * time.Second))
	var summary string
	require.Eventually(t, func() bool {
		for _, l := range strings.Split(string(p.TakeLogs(1<<20)), "\n") {
			if strings.Contains(l, "suppressed") {
				summary = l
			}
		}
		return summary != ""
	}, 3*time.Second, time.Millisecond, "no line reported the suppressed lines")
	t.Log(summary)
	assert.True(t, strings.HasPrefix(summary, "WARNING dropping a frame from 127.0.0.1:7401"), summary)
	assert.Contains(t, summary, "490 lines like this suppressed in the last")
	// And the cause logs again.
	require.NoError(t, stranger.tr.Send(id, frame))
	require.Eventually(t, func() bool { return countLines(string(p.TakeLogs(1<<20)), dropped) == 1 },
		3*time.Second, time.Millisecond)
}

// The INFO lines a stranger causes at will (a session it opened registered
// a data path, the session it closed) are rate-limited like any other:
// strangers that open and close 5 000 sessions, 10 000 such lines, leave at
// most the limit's lines of each cause in its window (10, and one line
// counting the rest). Before, INFO lines were never limited.
func TestInfoLinesStrangersCauseAreRateLimited(t *testing.T) {
	c := newCluster(t)
	p := c.node(1, func(cfg *config.Config) { cfg.MaxPeers = 256 }) // 64 handshakes at once
	const strangers, rounds = 50, 100                               // 5 000 sessions
	var rs []*rawPeer
	for i := range strangers {
		rs = append(rs, c.raw(fmt.Sprintf("127.0.5.%d:7500", i+1)))
	}
	start := time.Now()
	opened := int64(0)
	for range rounds {
		for _, r := range rs {
			r.connect(p.id)
		}
		opened += strangers
		require.Eventually(t, func() bool { st := p.Stats(); return st.DataPeers == strangers && st.SessionsOpened == opened },
			10*time.Second, time.Millisecond)
		for _, r := range rs {
			r.send(p.id, &protocol.ConnectAck{PeerID: r.id})
			r.send(p.id, &protocol.Disconnect{})
		}
		require.Eventually(t, func() bool { return p.Stats().Sessions == 0 }, 10*time.Second, time.Millisecond)
	}
	windows := int(time.Since(start)/(10*time.Second)) + 1
	logs := string(p.TakeLogs(1 << 24))
	for _, cause := range []string{": data path mem", "it closed the session; session closed"} {
		n := countLines(logs, cause)
		assert.LessOrEqual(t, n, windows*11, "%q: %d lines for %d sessions in %d windows of 10 s", cause, n, strangers*rounds, windows)
		assert.Positive(t, n, "%q: no line at all", cause)
	}
}

package tier_test

import (
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

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

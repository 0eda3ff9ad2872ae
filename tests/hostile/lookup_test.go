package hostile

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/protocol"
	"github.com/peerkv/peerkv/core/tier"
)

func all(rs []tier.LookupResult, want tier.LookupResult) bool {
	for _, r := range rs {
		if r != want {
			return false
		}
	}
	return true
}

// Case 6. A producer that answers every lookup with an empty lookup_resp
// (every 300 ms) must not keep the consumer's keys at RETRY: they turn MISS
// within lookup_timeout_s.
func TestEmptyLookupRespsDoNotRetryForever(t *testing.T) {
	t.Parallel()
	T := OpenNode(t, map[string]any{"lookup_timeout_s": 2.0})
	a := NewAttacker(t, "127.0.0.1")
	kv := uniq("p2p")
	keys := Keys(kv, 4)
	T.Consume("r", kv, a.ID)
	c := a.Dial(T.ID(), a.ID, "")
	c.MustAwait("connect", 3*time.Second)
	c.Accept(3 * time.Second)

	var first, last time.Time
	var res []tier.LookupResult
	start := time.Now()
	for time.Since(start) < 6*time.Second {
		res = T.LookupAll("r", keys)
		if all(res, tier.Miss) {
			break
		}
		require.NoError(t, T.OnScheduleEnd())
		if _, ok := c.Await("lookup", 10*time.Millisecond); ok && first.IsZero() {
			first = time.Now()
		}
		if !first.IsZero() && time.Since(last) >= 300*time.Millisecond {
			c.Send(&protocol.LookupResp{KVRequestID: kv, Keys: [][]byte{}, Hits: []bool{}})
			last = time.Now()
		}
	}
	require.False(t, first.IsZero(), "the consumer never sent its lookup")
	took := time.Since(first)
	require.True(t, all(res, tier.Miss), "after %v of empty lookup_resps the consumer still answers %v (lookup_timeout_s 2)",
		took.Round(time.Millisecond), res)
	require.Less(t, took, 3500*time.Millisecond, "keys turned MISS only after %v", took)
	require.NoError(t, T.FinishRequest("r"))
}

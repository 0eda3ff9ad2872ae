package hostile

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/protocol"
	"github.com/peerkv/peerkv/core/tier"
)

// Case 13. R1 pulls kv K from the attacker; the host finishes R1 while the
// load is in flight; the attacker then answers the abort with
// transfer_done success=false. R2, reusing K, must still ask the wire
// (RETRY, then the answer), not read MISS.
func TestLateTransferDoneDoesNotPoisonAReusedKVID(t *testing.T) {
	t.Parallel()
	T := OpenNode(t, nil)
	a := NewAttacker(t, "127.0.0.1")
	kv := uniq("reuse")
	keys := Keys(kv, 4)
	T.Consume("r1", kv, a.ID)
	c := a.Dial(T.ID(), a.ID, "")
	c.MustAwait("connect", 3*time.Second)
	c.Accept(3 * time.Second)

	// awaitLookup drives the host's steps until the lookup of reqID is on the wire.
	awaitLookup := func(reqID string) (Frame, bool) {
		deadline := time.Now().Add(3 * time.Second)
		for time.Now().Before(deadline) {
			T.LookupAll(reqID, keys)
			require.NoError(t, T.OnScheduleEnd())
			if f, ok := c.Await("lookup", 10*time.Millisecond); ok {
				return f, true
			}
		}
		return Frame{}, false
	}
	lu, ok := awaitLookup("r1")
	require.True(t, ok, "R1's lookup never reached the attacker")
	c.Send(&protocol.LookupResp{KVRequestID: kv, Keys: keys, Hits: []bool{true, true, true, true}})
	within(t, 3*time.Second, func() bool { return all(T.LookupAll("r1", keys), tier.Hit) }, "R1's keys never turned HIT")
	t.Logf("R1 round %d", lu.Uint("round_seq"))

	load := T.Load("r1", keys, Range(0, 4))
	c.MustAwait("fetch", 3*time.Second)
	require.NoError(t, T.FinishRequest("r1"))
	ab := c.MustAwait("abort_fetch", 3*time.Second)
	c.Send(&protocol.TransferDone{KVRequestID: kv, Success: false, RoundSeq: ab.Uint("round_seq")})
	r := T.MustJob(load, 3*time.Second)
	assert.False(t, r.Success)

	T.Consume("r2", kv, a.ID)
	res := T.LookupAll("r2", keys)
	assert.True(t, all(res, tier.Retry), "R2, reusing kv_request_id %s after R1's late transfer_done, answers %v: "+
		"its lookups never reach the wire", kv, res)
	_, ok = awaitLookup("r2")
	assert.True(t, ok, "R2's lookup never reached the attacker")
	require.NoError(t, T.FinishRequest("r2"))
}

package faults

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/protocol"
)

// TestStaleWriteIntoReusedSlots: a load fails by its abort-ack timeout
// while the producer's write is still in flight; the host reuses the
// slots at once for the next load from the same producer. The first
// load's write lands late, while the second is in flight: the second load
// must not be reported successful with the first one's bytes.
func TestStaleWriteIntoReusedSlots(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	prod, cons := e.open(prodPort), e.open(consPort)
	require.True(t, e.run("pd", prod, cons).ok, "warm-up")

	kv1 := uniq("stale")
	keys1 := keysFor(kv1, 4)
	e.prefill(prod, kv1, keys1)
	const stall = 3500 * time.Millisecond // past load + abort-ack timeouts
	e.c.Data.SetDelay(stall)
	req1 := "d-" + kv1
	_, err := cons.StartRequest(req1, prefillerParams(kv1, prod))
	require.NoError(t, err)
	first := e.submitLoad(cons, req1, keys1)
	first = e.settle(cons, first, e.wait(first.job, loadBound))
	require.False(t, first.ok, "no abort_ack while the write is in flight: failed by the abort-ack timeout")
	require.NoError(t, cons.FinishRequest(req1))

	// The host reuses the same slots for the next request from this peer;
	// its transfer_done is slow.
	e.c.Data.SetDelay(0)
	cons.Wire.Set(Rule{Dir: In, Types: []protocol.Type{protocol.TypeTransferDone}, Action: Delay, Times: 1, Delay: time.Second})
	kv2 := uniq("fresh")
	keys2 := keysFor(kv2, 4)
	e.prefill(prod, kv2, keys2)
	req2 := "d-" + kv2
	_, err = cons.StartRequest(req2, prefillerParams(kv2, prod))
	require.NoError(t, err)
	e.mu.Lock()
	e.next[cons] = first.slots[0] // the same slots again
	e.mu.Unlock()
	second := e.submitLoad(cons, req2, keys2)
	require.Equal(t, first.slots, second.slots)
	r := e.wait(second.job, loadBound)
	if r.Success {
		for i, s := range second.slots {
			row := cons.Row(s)
			require.NotEqual(t, -1, Check(row, keys1[i]),
				"wrong bytes: load %d was reported successful but slot %d holds the rows of the failed load %d, "+
					"written late by the same peer and admitted by the write guard", second.job, s, first.job)
			require.Equal(t, -1, Check(row, keys2[i]), "wrong bytes in slot %d", s)
		}
	}
	require.NoError(t, cons.FinishRequest(req2))
	e.finish()
}

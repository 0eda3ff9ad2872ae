package hostile

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/protocol"
)

func zeroRows(n *Node, rows []int) bool {
	for _, r := range rows {
		for _, b := range n.Region.Row(uint64(r)) {
			if b != 0 {
				return false
			}
		}
	}
	return true
}

// Case 7a. The attacker fetches the prefiller's kv id first; a real decoder
// fetching it afterwards is refused promptly and the binding stays.
func TestPDBindingDoesNotMoveAttackerFirst(t *testing.T) {
	t.Parallel()
	P := OpenNode(t, map[string]any{"unbound_store_timeout_s": 10.0, "store_timeout_s": 10.0})
	D := OpenNode(t, map[string]any{"load_timeout_s": 10.0})
	a := NewAttacker(t, "127.0.0.1")
	c := a.Dial(P.ID(), a.ID, "")
	c.Handshake(3 * time.Second)

	kv := uniq("pd")
	keys := Keys(kv, 8)
	P.Prefill("p", kv)
	c.Send(&protocol.Fetch{KVRequestID: kv, Keys: keys, BlockIndexes: rows64(0, 8)})
	// The attacker's fetch binds kv first.
	if _, has := P.Gauge("serve_keys_wanted"); has {
		within(t, 3*time.Second, func() bool { v, _ := P.Gauge("serve_keys_wanted"); return v == 8 }, "the attacker's fetch was never recorded")
	} else {
		time.Sleep(300 * time.Millisecond)
	}

	D.Decode("d", kv, P.ID())
	load := D.Load("d", keys, Range(0, 8))
	r, ok := D.WaitJob(load, 4*time.Second)
	assert.True(t, ok, "the real decoder's fetch of a kv id the attacker fetched first got no answer within 4 s "+
		"(load_timeout 10 s, unbound_store_timeout 10 s): it was not refused promptly")
	if ok {
		assert.False(t, r.Success, "the real decoder loaded a kv id bound to another fetcher")
	}

	store := P.Store("p", keys, Range(0, 8))
	td, ok := c.Await("transfer_done", 4*time.Second)
	assert.True(t, ok && td.Bool("success"), "the first fetcher lost the binding: transfer_done %v, success %v, %d rows received",
		ok, td.Bool("success"), a.Sink.Rows())
	assert.True(t, zeroRows(D, Range(0, 8)), "rows of the kv id bound to the attacker reached the second fetcher")
	require.NoError(t, P.FinishRequest("p"))
	require.NoError(t, D.FinishRequest("d"))
	P.MustJob(store, 4*time.Second)
	D.MustJob(load, 12*time.Second)
}

// Case 7b. The real decoder fetches first and keeps the binding; the
// attacker's later fetch is refused promptly and gets no rows.
func TestPDBindingDoesNotMoveDecoderFirst(t *testing.T) {
	t.Parallel()
	P := OpenNode(t, map[string]any{"unbound_store_timeout_s": 10.0, "store_timeout_s": 10.0})
	D := OpenNode(t, map[string]any{"load_timeout_s": 10.0})
	a := NewAttacker(t, "127.0.0.1")
	c := a.Dial(P.ID(), a.ID, "")
	c.Handshake(3 * time.Second)

	kv := uniq("pd")
	keys := Keys(kv, 8)
	P.Prefill("p", kv)
	D.Decode("d", kv, P.ID())
	load := D.Load("d", keys, Range(0, 8))
	s1 := P.Store("p", keys[:4], Range(0, 4))
	// The decoder's fetch is bound and half supplied once 4 of its keys are
	// still wanted (reading its region now would race the data path).
	if _, has := P.Gauge("serve_keys_wanted"); has {
		within(t, 4*time.Second, func() bool { v, _ := P.Gauge("serve_keys_wanted"); return v == 4 },
			"the real decoder's fetch was never bound and half supplied")
	} else {
		time.Sleep(500 * time.Millisecond)
	}

	c.Send(&protocol.Fetch{KVRequestID: kv, Keys: keys, BlockIndexes: rows64(0, 8)})
	td, ok := c.Await("transfer_done", 2*time.Second)
	assert.True(t, ok, "the attacker's fetch of a kv id bound to the real decoder got no transfer_done within 2 s "+
		"(unbound_store_timeout 10 s): it was not refused promptly")
	if ok {
		assert.False(t, td.Bool("success"), "the attacker's fetch of someone else's kv id succeeded")
	}

	s2 := P.Store("p", keys[4:], Range(4, 4))
	lr, ok := D.WaitJob(load, 4*time.Second)
	assert.True(t, ok && lr.Success, "the real decoder lost the binding to the attacker: load reported %v, success %v", ok, lr.Success)
	for i := 4; i < 8; i++ {
		assert.True(t, Holds(D.Region.Row(uint64(i)), keys[i]), "decoder row %d", i)
	}
	assert.Zero(t, a.Sink.Rows(), "rows of the decoder's kv id went to the attacker")
	require.NoError(t, P.FinishRequest("p"))
	require.NoError(t, D.FinishRequest("d"))
	P.MustJob(s1, 4*time.Second)
	P.MustJob(s2, 4*time.Second)
	D.MustJob(load, 12*time.Second)
}

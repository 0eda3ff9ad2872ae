package hostile

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/peerkv/peerkv/core/protocol"
)

// bigRegionHandshake completes a handshake claiming a 4096-row region, so
// that fetches may name rows up to 4095.
func bigRegionHandshake(t *testing.T, a *Attacker, c *Conn) {
	t.Helper()
	m := a.ConnectMsg(c.Identity)
	m.NumBlocks = 4096
	c.Send(m)
	c.MustAwait("connect", 3*time.Second)
	c.Send(&protocol.ConnectAck{PeerID: c.Identity})
	c.MustAwait("connect_ack", 3*time.Second)
}

func rows64(from, n int) []uint64 {
	out := make([]uint64, n)
	for i := range out {
		out[i] = uint64(from + i)
	}
	return out
}

// Case 5a. 200 fetches of 2000 keys each for kv ids nobody stores: once the
// store timeout passes, each is answered transfer_done success=false and
// the node holds nothing for them.
func TestFetchFloodForUnknownKVIDsIsAnsweredAndForgotten(t *testing.T) {
	t.Parallel()
	T := OpenNode(t, map[string]any{"store_timeout_s": 1.0, "unbound_store_timeout_s": 1.0, "max_keys_per_peer": 1 << 20})
	D := OpenNode(t, nil)
	a := NewAttacker(t, "127.0.0.1")
	c := a.Dial(T.ID(), a.ID, "")
	bigRegionHandshake(t, a, c)

	const fetches, perFetch = 200, 2000
	idx := rows64(0, perFetch)
	for i := range fetches {
		kv := fmt.Sprintf("ghost-%d", i)
		c.Send(&protocol.Fetch{KVRequestID: kv, Keys: Keys(kv, perFetch), BlockIndexes: idx})
		if i%20 == 19 {
			a.Pump(0)
		}
	}
	sent := time.Now()
	answered, succeeded := map[string]bool{}, 0
	for len(answered) < fetches && time.Since(sent) < 6*time.Second {
		f, ok := c.Await("transfer_done", 50*time.Millisecond)
		if !ok {
			continue
		}
		if f.Bool("success") {
			succeeded++
		}
		answered[f.Str("kv_request_id")] = true
	}
	t.Logf("%d of %d fetches answered %v after the last was sent", len(answered), fetches, time.Since(sent).Round(time.Millisecond))
	assert.Len(t, answered, fetches, "fetches for kv ids nobody stores must each get transfer_done once the store timeout (1 s) passed")
	assert.Zero(t, succeeded, "a fetch for keys nobody stores was answered success=true")
	T.RequireGauge("serve_kv_ids", 3*time.Second, func(v int64) bool { return v == 0 }, "no kv id of the flood is held")
	T.RequireGauge("serve_keys_wanted", 3*time.Second, func(v int64) bool { return v == 0 }, "no key of the flood is held")
	within(t, 3*time.Second, func() bool { return !T.HasPendingWork() }, "the node still has pending work after the flood")
	Pull(t, T, D)
}

// Case 5b. Fetches beyond max_keys_per_peer are refused at once
// (transfer_done success=false), not held.
func TestFetchBeyondMaxKeysPerPeerIsRefusedAtOnce(t *testing.T) {
	t.Parallel()
	T := OpenNode(t, map[string]any{"max_keys_per_peer": 1000, "unbound_store_timeout_s": 10.0, "store_timeout_s": 10.0})
	D := OpenNode(t, nil)
	a := NewAttacker(t, "127.0.0.1")
	c := a.Dial(T.ID(), a.ID, "")
	bigRegionHandshake(t, a, c)

	// One fetch over the cap on its own.
	c.Send(&protocol.Fetch{KVRequestID: "over", Keys: Keys("over", 2000), BlockIndexes: rows64(0, 2000)})
	f, ok := c.Await("transfer_done", 2*time.Second)
	if assert.True(t, ok, "a fetch of 2000 keys with max_keys_per_peer 1000 was not refused within 2 s (unbound_store_timeout 10 s)") {
		assert.Equal(t, "over", f.Str("kv_request_id"))
		assert.False(t, f.Bool("success"))
	}
	// Two fetches that together exceed it: the second is refused.
	c.Send(&protocol.Fetch{KVRequestID: "first", Keys: Keys("first", 600), BlockIndexes: rows64(0, 600)})
	c.Send(&protocol.Fetch{KVRequestID: "second", Keys: Keys("second", 600), BlockIndexes: rows64(600, 600)})
	f, ok = c.a.Await(func(f Frame) bool { return Is(T.ID(), a.ID, "transfer_done")(f) && f.Str("kv_request_id") == "second" }, 2*time.Second)
	if assert.True(t, ok, "the fetch that takes the peer past max_keys_per_peer was not refused within 2 s") {
		assert.False(t, f.Bool("success"))
	}
	if v, has := T.Gauge("serve_keys_wanted"); has {
		assert.LessOrEqual(t, v, int64(1000), "keys held for one peer beyond max_keys_per_peer")
	}
	Pull(t, T, D)
}

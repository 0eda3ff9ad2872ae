package hostile

import (
	"bytes"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/protocol"
)

// sameHostOptions turn the same-host copy path on and keep NIXL out of the
// way (auto logs that NIXL is missing and goes on).
func sameHostOptions(extra map[string]any) map[string]any {
	o := map[string]any{"data_transport": "auto", "same_host_copy": true, "nixl_library": "/nonexistent/libnixl_capi.so"}
	for k, v := range extra {
		o[k] = v
	}
	return o
}

// Case 1. The attacker echoes the target's own same-host offer (and the
// target's own region address, with num_blocks 2^40) as its connect, then
// fetches rows the target stores into rows of "its" region, which is the
// target's. The target must never copy into its own process.
func TestSameHostReflectionNeverWritesIntoItself(t *testing.T) {
	t.Parallel()
	T := OpenShmNode(t, sameHostOptions(map[string]any{"unbound_store_timeout_s": 1.0}))
	a := NewAttacker(t, "127.0.0.1")

	// Lure the target into dialing us, so it speaks first and offers its
	// same-host path.
	T.Consume("lure", uniq("lure"), a.ID)
	c := a.Dial(T.ID(), a.ID, "")
	theirs := c.MustAwait("connect", 3*time.Second)
	offer := theirs.Sub(protocol.CapabilitiesKey)
	require.NotNil(t, offer, "the target's connect carries no peerkv capabilities: %v", theirs.Map)
	t.Logf("target's data paths %q; its offer: keys %v, base_addr %#x", T.Stats().DataPaths, sortedKeys(offer), theirs.Uint("base_addr"))
	if _, ok := offer["same_host"]; !ok {
		if _, ok := offer["local_process"]; !ok {
			t.Logf("the target offers no same-host path here: %s", tail(T.Logs()))
		}
	}

	kv := uniq("victim")
	keys := Keys(kv, 4)
	T.Prefill("prefill", kv)
	store := T.Store("prefill", keys, Range(0, 4))
	before := bytes.Clone(T.Region.Mem)

	base := theirs.Uint("base_addr")
	if base == 0 {
		base = T.Region.BaseAddr() // an attacker that learnt it otherwise
	}
	c.SendMap(map[string]any{
		"type": "connect", "peer_id": a.ID, "agent_metadata": []byte{}, "base_addr": base,
		"num_blocks": uint64(1) << 40, "block_len": uint64(RowLen), "config_fingerprint": Fingerprint,
		"hash_seed": HashSeed, protocol.CapabilitiesKey: offer,
	})
	c.Send(&protocol.ConnectAck{PeerID: a.ID})
	if _, acked := c.Await("connect_ack", 2*time.Second); acked {
		// Rows 8..11 of "our" region are rows 8..11 of the target's.
		c.Send(&protocol.Fetch{KVRequestID: kv, Keys: keys, BlockIndexes: []uint64{8, 9, 10, 11}})
		if td, ok := c.Await("transfer_done", 3*time.Second); ok {
			t.Logf("target answered the reflected fetch: success=%v", td.Bool("success"))
		}
	} else {
		t.Logf("target refused the reflected connect (no connect_ack)")
		time.Sleep(300 * time.Millisecond)
	}

	for r := 4; r < NumRows; r++ {
		if !assert.True(t, bytes.Equal(before[r*RowLen:(r+1)*RowLen], T.Region.Row(uint64(r))),
			"row %d of the target's own region changed: the target copied its stored rows into its own process", r) {
			break
		}
	}
	self := regexp.MustCompile(`peer ` + regexp.QuoteMeta(a.ID) + `: data path (cma|shm|same)`)
	assert.False(t, self.MatchString(T.Logs()), "the target chose its same-host path toward a peer that echoed its own offer: %s",
		self.FindString(T.Logs()))

	require.NoError(t, T.FinishRequest("prefill"))
	require.NoError(t, T.FinishRequest("lure"))
	T.MustJob(store, 4*time.Second)
}

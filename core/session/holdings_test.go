package session

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/protocol"
)

// checkHoldings recounts the slow way what the peer makes s's producer
// hold and fails the test if the running totals differ (some change of a
// round or lookup bypassed holdings.go), or if overCap's verdict differs
// from the one the recount gives.
func checkHoldings(t testing.TB, s *Session) {
	t.Helper()
	p := &s.producer
	var want holdings
	for kvID, req := range p.requests {
		require.Same(t, &p.held, req.held, "kv id %s keeps other totals", kvID)
		for seq, r := range req.rounds {
			require.Same(t, &p.held, r.held, "round %d of kv id %s is filed but not counted", seq, kvID)
			want.entries++
			want.keys += max(1, len(r.wanted)+len(r.available))
			want.wanted += len(r.wanted)
		}
		for _, l := range req.lookups {
			want.entries++
			want.keys += max(1, len(l.keys))
		}
	}
	require.Equal(t, want, p.held, "running totals (got) against a recount (want)")
	kvIDs := []string{"a kv id the peer does not hold"}
	for kvID := range p.requests {
		kvIDs = append(kvIDs, kvID)
	}
	for _, kvID := range kvIDs {
		for _, keys := range []int{0, 1, 3, p.env.Cfg.MaxKeysPerPeer} {
			require.Equal(t, walkedOverCap(p, want, kvID, keys), p.overCap(kvID, keys), "kv id %s, %d keys", kvID, keys)
		}
	}
}

// walkedOverCap is overCap's verdict from recounted totals, as it was when
// overCap walked every round and lookup itself.
func walkedOverCap(p *producer, recount holdings, kvID string, keys int) string {
	cfg := p.env.Cfg
	if _, known := p.requests[kvID]; !known && len(p.requests) >= cfg.MaxRequestsPerPeer {
		return fmt.Sprintf("the peer already holds %d kv ids here (max_requests_per_peer)", len(p.requests))
	}
	if recount.entries >= cfg.MaxRequestsPerPeer {
		return fmt.Sprintf("the peer already holds %d rounds and lookups here (max_requests_per_peer)", recount.entries)
	}
	keys = max(1, keys)
	if recount.keys+keys > cfg.MaxKeysPerPeer {
		return fmt.Sprintf("the peer's %d keys would exceed the %d it may hold here (max_keys_per_peer)", recount.keys+keys, cfg.MaxKeysPerPeer)
	}
	return ""
}

// The totals follow a round through supply, demand, a write and its end,
// and a session's close leaves nothing counted.
func TestHoldingsFollowEveryChange(t *testing.T) {
	p := handshaked(t)
	s, o := p.sb, p.b
	o.reachData(s.PeerID(), testRows)
	s.AddStoredBlocks("pd", [][]byte{key(1), key(2)}, []uint64{0, 1}, 1, 0, false)
	checkHoldings(t, s)
	require.Equal(t, holdings{entries: 1, keys: 2}, s.producer.held)

	s.Handle(&protocol.Fetch{KVRequestID: "pd", Keys: [][]byte{key(1), key(3)}, BlockIndexes: []uint64{0, 1}})
	checkHoldings(t, s)
	require.Equal(t, holdings{entries: 1, keys: 2, wanted: 1}, s.producer.held, "key 1 written, key 3 awaits supply")
	_, wanted := s.Holds()
	require.Equal(t, 1, wanted)

	s.Handle(&protocol.Lookup{KVRequestID: "lu", Keys: [][]byte{key(4), key(5), key(6)}})
	checkHoldings(t, s)
	require.Equal(t, holdings{entries: 2, keys: 5, wanted: 1}, s.producer.held)

	drainCompletions(s, o)
	checkHoldings(t, s)
	require.Equal(t, holdings{entries: 2, keys: 5, wanted: 1}, s.producer.held, "the round still awaits key 3")
	s.FinishProducer("pd")
	checkHoldings(t, s)
	require.Equal(t, holdings{entries: 1, keys: 3}, s.producer.held, "the round failed and ended")

	s.Close("test end", Failure)
	s.Release()
	checkHoldings(t, s)
	require.Zero(t, s.producer.held)
}

// Every entry holds at least one key's worth; a frame that would take the
// peer past max_keys_per_peer is refused, one that reaches it is not.
func TestKeysCapCountsEveryEntry(t *testing.T) {
	p := handshaked(t, func(c *config.Config) { c.MaxKeysPerPeer = 6 })
	s, o := p.sb, p.b
	s.Handle(&protocol.Lookup{KVRequestID: "three", Keys: [][]byte{key(1), key(2), key(3)}})
	s.Handle(&protocol.Lookup{KVRequestID: "empty", Keys: [][]byte{}})
	checkHoldings(t, s)
	require.Equal(t, holdings{entries: 2, keys: 4}, s.producer.held)
	require.Len(t, o.inbound, 2)

	s.Handle(&protocol.Fetch{KVRequestID: "fetch", Keys: [][]byte{key(4), key(5), key(6)}, BlockIndexes: []uint64{0, 1, 2}})
	checkHoldings(t, s)
	require.Contains(t, o.logs[len(o.logs)-1], "fetch kv_request_id=fetch round=0 refused: the peer's 7 keys would exceed the 6 it may hold here (max_keys_per_peer)")
	done := transferDones(o.take())
	require.Len(t, done, 1)
	require.False(t, done[0].Success)

	s.Handle(&protocol.Fetch{KVRequestID: "fetch", Keys: [][]byte{key(4), key(5)}, BlockIndexes: []uint64{0, 1}})
	checkHoldings(t, s)
	require.Equal(t, holdings{entries: 3, keys: 6, wanted: 2}, s.producer.held, "exactly at the cap")
	require.Equal(t, []string{"fetch"}, o.fetches)

	s.Handle(&protocol.Lookup{KVRequestID: "empty", Keys: [][]byte{}})
	checkHoldings(t, s)
	require.Contains(t, o.logs[len(o.logs)-1], "lookup kv_request_id=empty answered as misses: the peer's 7 keys would exceed the 6 it may hold here (max_keys_per_peer)")
	require.Len(t, o.inbound, 2)
}

// Supply dropped by an abort or by store_timeout_s leaves the totals, and
// the tombstones left behind count one key each.
func TestHoldingsFollowDroppedSupply(t *testing.T) {
	p := handshaked(t, func(c *config.Config) { c.StoreTimeout = time.Second })
	s, o := p.sb, p.b
	s.AddStoredBlocks("aborted", [][]byte{key(1), key(2), key(3)}, []uint64{0, 1, 2}, 1, 0, false)
	s.AddStoredBlocks("unfetched", [][]byte{key(4), key(5)}, []uint64{3, 4}, 2, 0, false)
	checkHoldings(t, s)
	require.Equal(t, holdings{entries: 2, keys: 5}, s.producer.held)

	s.Handle(&protocol.AbortFetch{KVRequestID: "aborted", RoundSeq: 0})
	checkHoldings(t, s)
	require.Equal(t, holdings{entries: 2, keys: 3}, s.producer.held, "a tombstone and two stored keys")
	require.Equal(t, map[int64]bool{1: false}, o.stores)

	o.tick(1500 * time.Millisecond) // checks the totals too
	require.Equal(t, holdings{entries: 2, keys: 2}, s.producer.held, "two tombstones")
	require.Equal(t, map[int64]bool{1: false, 2: false}, o.stores)
}

package session

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/protocol"
)

// handshaked returns a pair past the handshake with nothing left to send.
func handshaked(t testing.TB, mutate ...func(*config.Config)) *pair {
	p := newPair(t, mutate...)
	p.pump()
	require.True(t, p.sa.Ready())
	require.True(t, p.sb.Ready())
	return p
}

func lookupResps(ms []protocol.Message) []*protocol.LookupResp {
	var out []*protocol.LookupResp
	for _, m := range ms {
		if r, ok := m.(*protocol.LookupResp); ok {
			out = append(out, r)
		}
	}
	return out
}

func transferDones(ms []protocol.Message) []*protocol.TransferDone {
	var out []*protocol.TransferDone
	for _, m := range ms {
		if r, ok := m.(*protocol.TransferDone); ok {
			out = append(out, r)
		}
	}
	return out
}

// A producer answering with empty lookup_resps must not hold the keys at
// RETRY: the deadline runs from when the lookup was sent.
func TestEmptyAnswersDoNotExtendTheLookupDeadline(t *testing.T) {
	p := handshaked(t, func(c *config.Config) { c.LookupTimeout = 2 * time.Second })
	_, known := p.sa.RegisterLookup("kv", key(1))
	require.False(t, known)
	p.sa.FlushLookups()
	require.Len(t, p.a.take(), 1)
	for range 5 {
		p.a.tick(500 * time.Millisecond)
		p.sa.Handle(&protocol.LookupResp{KVRequestID: "kv", Keys: [][]byte{}, Hits: []bool{}})
	}
	hit, known := p.sa.RegisterLookup("kv", key(1))
	assert.True(t, known, "answered as a miss at the deadline")
	assert.False(t, hit)
}

func TestFetchesNobodySuppliesExpire(t *testing.T) {
	p := handshaked(t, func(c *config.Config) { c.UnboundStoreTimeout = 3 * time.Second })
	for i := range 10 {
		p.sb.Handle(&protocol.Fetch{KVRequestID: "nobody-" + string(rune('a'+i)), Keys: [][]byte{key(i)}, BlockIndexes: []uint64{0}})
		checkHoldings(t, p.sb)
	}
	kv, wanted := p.sb.Holds()
	assert.Equal(t, 10, kv)
	assert.Equal(t, 10, wanted)
	p.b.tick(2 * time.Second)
	assert.Empty(t, transferDones(p.b.take()), "the prefill may still come")
	p.b.tick(2 * time.Second)
	done := transferDones(p.b.take())
	require.Len(t, done, 10)
	for _, d := range done {
		assert.False(t, d.Success)
	}
	kv, wanted = p.sb.Holds()
	assert.Zero(t, kv)
	assert.Zero(t, wanted)
	assert.False(t, p.sb.HasPendingWork())
}

func TestAPeerCannotMakeUsHoldMoreThanItsShare(t *testing.T) {
	p := handshaked(t, func(c *config.Config) { c.MaxRequestsPerPeer = 4; c.MaxKeysPerPeer = 6 })
	for i := range 4 {
		p.sb.Handle(&protocol.Lookup{KVRequestID: "lu-" + string(rune('a'+i)), Keys: [][]byte{key(i)}})
		checkHoldings(t, p.sb)
	}
	assert.Len(t, p.b.inbound, 4)
	p.sb.Handle(&protocol.Lookup{KVRequestID: "one-too-many", Keys: [][]byte{key(9)}})
	checkHoldings(t, p.sb)
	assert.Len(t, p.b.inbound, 4, "not queued for the host")
	resp := lookupResps(p.b.take())
	require.Len(t, resp, 1)
	assert.Equal(t, []bool{false}, resp[0].Hits, "answered at once, as a miss")
	assert.Contains(t, p.b.logs[len(p.b.logs)-1], "lookup kv_request_id=one-too-many answered as misses: the peer already holds 4 kv ids here (max_requests_per_peer)")

	// A fetch under an existing kv id: refused too, the rounds and lookups
	// already at the cap (the keys cap: TestKeysCapCountsEveryEntry).
	p.sb.Handle(&protocol.Fetch{KVRequestID: "lu-a", Keys: [][]byte{key(20), key(21), key(22)}, BlockIndexes: []uint64{0, 1, 2}})
	checkHoldings(t, p.sb)
	done := transferDones(p.b.take())
	require.Len(t, done, 1)
	assert.False(t, done[0].Success)
	assert.Empty(t, p.b.fetches)

	// Abort tombstones for unknown rounds are capped too, and answered.
	for i := range 100 {
		p.sb.Handle(&protocol.AbortFetch{KVRequestID: fmt.Sprint("gone-", i), RoundSeq: 1})
		checkHoldings(t, p.sb)
	}
	kv, _ := p.sb.Holds()
	assert.Equal(t, 4, kv)
	acks := 0
	for _, m := range p.b.take() {
		if _, ok := m.(*protocol.AbortAck); ok {
			acks++
		}
	}
	assert.Equal(t, 100, acks)
}

func TestAbortTombstonesExpire(t *testing.T) {
	p := handshaked(t, func(c *config.Config) { c.ReapedIDRetention = 2 * time.Second })
	p.sb.Handle(&protocol.AbortFetch{KVRequestID: "x", RoundSeq: 3})
	checkHoldings(t, p.sb)
	kv, _ := p.sb.Holds()
	require.Equal(t, 1, kv)
	p.b.tick(3 * time.Second)
	kv, _ = p.sb.Holds()
	assert.Zero(t, kv)
}

// An inbound lookup the host checked out and never answered is answered as
// misses one deadline later; the host's late answer releases its pins.
func TestCheckedOutLookupsHaveADeadline(t *testing.T) {
	p := handshaked(t, func(c *config.Config) { c.InboundLookupTimeout = time.Second })
	p.sb.Handle(&protocol.Lookup{KVRequestID: "kv", Keys: [][]byte{key(1)}})
	require.Len(t, p.b.inbound, 1)
	l := p.b.inbound[0]
	l.CheckOut()
	p.b.tick(1500 * time.Millisecond)
	assert.Empty(t, lookupResps(p.b.take()), "still within the host's grace")
	p.b.tick(time.Second)
	resp := lookupResps(p.b.take())
	require.Len(t, resp, 1)
	assert.Equal(t, []bool{false}, resp[0].Hits)
	require.Len(t, p.b.finished, 1)

	finished, err := p.sb.AnswerLookup(l, []Answer{AnswerHit}, 7, []uint64{3})
	require.NoError(t, err)
	assert.True(t, finished)
	assert.Equal(t, map[int64]bool{7: false}, p.b.stores, "the late pin is released at once")
}

// Rows pinned for a lookup whose fetch never comes are released at
// store_timeout_s, and the late fetch gets a failure, never stale rows.
func TestUnfetchedLookupPinsAreReleased(t *testing.T) {
	p := handshaked(t, func(c *config.Config) { c.StoreTimeout = 2 * time.Second })
	p.sb.Handle(&protocol.Lookup{KVRequestID: "kv", Keys: [][]byte{key(1)}})
	l := p.b.inbound[0]
	l.CheckOut()
	finished, err := p.sb.AnswerLookup(l, []Answer{AnswerHit}, 9, []uint64{2})
	require.NoError(t, err)
	require.True(t, finished)
	p.b.take()
	p.b.tick(time.Second)
	assert.Empty(t, p.b.stores, "still pinned within store_timeout_s")
	p.b.tick(1500 * time.Millisecond)
	assert.Equal(t, map[int64]bool{9: false}, p.b.stores, "released, reported once")
	p.sb.Handle(&protocol.Fetch{KVRequestID: "kv", Keys: [][]byte{key(1)}, BlockIndexes: []uint64{0}})
	done := transferDones(p.b.take())
	require.Len(t, done, 1)
	assert.False(t, done[0].Success)
}

// Empty lookups and aborts of made-up rounds under one kv id are entries
// too: a flood of them is answered at once and never held.
func TestFloodsUnderOneKVIDAreBounded(t *testing.T) {
	p := handshaked(t, func(c *config.Config) { c.MaxRequestsPerPeer = 8 })
	for range 100 {
		p.sb.Handle(&protocol.Lookup{KVRequestID: "kv", Keys: [][]byte{}})
		checkHoldings(t, p.sb)
	}
	assert.Len(t, p.b.inbound, 8, "only up to the cap reach the host")
	assert.Len(t, lookupResps(p.b.take()), 92, "the rest are answered at once")
	assert.Contains(t, p.b.logs[len(p.b.logs)-1], "lookup kv_request_id=kv answered as misses: the peer already holds 8 rounds and lookups here (max_requests_per_peer)")
	for i := range 100 {
		p.sb.Handle(&protocol.AbortFetch{KVRequestID: "other", RoundSeq: uint64(i)})
		checkHoldings(t, p.sb)
	}
	rounds := 0
	for _, req := range p.sb.producer.requests {
		rounds += len(req.rounds)
	}
	assert.Zero(t, rounds, "no room left for tombstones")
}

// Nothing a cancelled or unfetched round leaves behind outlives its
// deadlines: stores after an abort are refused at once, pins nobody
// fetched turn into a tombstone at store_timeout_s, and tombstones are
// forgotten after reaped_id_retention_s.
func TestRoundsLeaveNothingBehind(t *testing.T) {
	p := handshaked(t, func(c *config.Config) { c.StoreTimeout = time.Second; c.ReapedIDRetention = 2 * time.Second })
	p.sb.Handle(&protocol.AbortFetch{KVRequestID: "pd", RoundSeq: 0})
	p.sb.AddStoredBlocks("pd", [][]byte{key(1)}, []uint64{0}, 1, 0, false)
	assert.Equal(t, map[int64]bool{1: false}, p.b.stores, "a store for an aborted round is released at once")

	p.sb.AddStoredBlocks("open", [][]byte{key(2)}, []uint64{1}, 2, 0, false)
	p.b.tick(1500 * time.Millisecond)
	assert.False(t, p.b.stores[2], "released at store_timeout_s")
	_, has := p.b.stores[2]
	assert.True(t, has)
	p.b.tick(2500 * time.Millisecond)
	kv, wanted := p.sb.Holds()
	assert.Zero(t, kv, "every tombstone forgotten")
	assert.Zero(t, wanted)
}

// An answer that arrives for a key before its lookup went out (a late
// answer of an earlier round, or an eager peer) is kept when the lookup is
// sent: the key stays HIT, and a load can find its holder.
func TestAnAnswerBeforeTheLookupWentOutIsKept(t *testing.T) {
	p := handshaked(t)
	for _, k := range []int{1, 2} {
		_, known := p.sa.RegisterLookup("kv", key(k))
		require.False(t, known)
	}
	p.sa.Handle(&protocol.LookupResp{KVRequestID: "kv", Keys: [][]byte{key(1)}, Hits: []bool{true}})
	p.sa.FlushLookups()
	require.Len(t, p.a.take(), 1)
	hit, known := p.sa.Probed("kv", key(1))
	assert.True(t, hit && known, "key 1 answered HIT before the flush")
	_, known = p.sa.Probed("kv", key(2))
	assert.False(t, known, "key 2 is asked, not answered")
}

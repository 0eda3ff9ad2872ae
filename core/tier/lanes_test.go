package tier_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/protocol"
	"github.com/peerkv/peerkv/core/tier"
)

// seenAtHost serves p's inbound lookups as a host that never answers would
// see them, returning the kv ids (from each ReqID) it was offered.
func seenAtHost(p *node) map[string]bool {
	seen := map[string]bool{}
	for {
		in, ok, _ := p.NextInbound(nil)
		if !ok {
			return seen
		}
		if in.Kind == tier.InboundEvaluate {
			parts := strings.Split(in.ReqID, ":")
			if len(parts) >= 4 {
				seen[parts[len(parts)-2]] = true
			}
		}
	}
}

// handshake completes a stock peer's handshake with p: its connect, then
// the ack of p's (until then p holds what it would send the peer).
func (r *rawPeer) handshake(p *node) {
	r.connect(p.id)
	deadline := time.After(3 * time.Second)
	for {
		m, ok := r.next(deadline)
		require.True(r.t, ok, "no connect from %s", p.id)
		if _, isConnect := m.(*protocol.Connect); isConnect {
			r.send(p.id, &protocol.ConnectAck{PeerID: r.id})
			return
		}
	}
}

func manyKeys(from, n int) [][]byte {
	idx := make([]int, n)
	for i := range idx {
		idx[i] = from + i
	}
	return keys(idx...)
}

// A session sending large lookups faster than they are decoded does not
// hold up another session's lookup: its frames wait in a lane of their
// own, bounded in bytes, and past the bound its session ends with the
// reason; the other session's small lookup reaches the host meanwhile.
// Before, every frame was decoded in arrival order on the one goroutine
// that takes frames, so the small lookup waited for all the large ones.
func TestOneSessionsLargeLookupsDoNotHoldUpAnothersLookup(t *testing.T) {
	c := newCluster(t)
	prod := c.node(1, func(cfg *config.Config) { cfg.MaxKeysPerPeer = 1 << 22 })
	flood, other := c.raw("127.0.0.1:7401"), c.raw("127.0.0.1:7402")
	flood.handshake(prod)
	other.handshake(prod)
	require.Eventually(t, func() bool { return prod.Stats().DataPeers == 2 }, 3*time.Second, time.Millisecond)

	const floods = 40
	big := manyKeys(0, config.MinMaxListItems) // over a MiB a frame
	for i := range floods {
		flood.send(prod.id, &protocol.Lookup{KVRequestID: fmt.Sprintf("flood%d", i), Keys: big})
	}
	other.send(prod.id, &protocol.Lookup{KVRequestID: "small", Keys: keys(1, 2, 3)})

	seen := map[string]bool{}
	require.Eventually(t, func() bool {
		for kv := range seenAtHost(prod) {
			seen[kv] = true
		}
		return seen["small"]
	}, 10*time.Second, time.Millisecond, "the other session's lookup never reached the host (seen %d, decoded %d, %+v)", len(seen), prod.FramesDecoded(), prod.Stats())
	assert.Less(t, prod.FramesDecoded(), int64(2+floods), "the small lookup waited for every large one to be decoded")
	require.Eventually(t, func() bool { return prod.Stats().Sessions == 1 }, 5*time.Second, time.Millisecond,
		"the flooding session was not ended")
	assert.Contains(t, string(prod.TakeLogs(1<<20)), "its frames arrive faster than they are decoded")
	assert.Less(t, len(seen), 1+floods/2, "most of the flood reached the host")
}

// Keys that all peers together make a producer hold are bounded too: past
// max_keys_per_peer in all, a peer's lookup over its share (the bound over
// the peers holding keys) is answered as misses at once, without reaching
// the host, while a peer within its share is still served. Before, each
// peer was bounded alone, so every session added max_keys_per_peer.
func TestKeysAllPeersHoldAreBoundedInTotal(t *testing.T) {
	c := newCluster(t)
	prod := c.node(1, func(cfg *config.Config) { cfg.MaxKeysPerPeer = 1000 })
	a, b, small := c.raw("127.0.0.1:7411"), c.raw("127.0.0.1:7412"), c.raw("127.0.0.1:7413")
	for _, r := range []*rawPeer{a, b, small} {
		r.handshake(prod)
	}
	require.Eventually(t, func() bool { return prod.Stats().DataPeers == 3 }, 3*time.Second, time.Millisecond)

	a.send(prod.id, &protocol.Lookup{KVRequestID: "a", Keys: manyKeys(0, 900)})
	seen := map[string]bool{}
	require.Eventually(t, func() bool {
		for kv := range seenAtHost(prod) {
			seen[kv] = true
		}
		return seen["a"]
	}, 3*time.Second, time.Millisecond)

	b.send(prod.id, &protocol.Lookup{KVRequestID: "b", Keys: manyKeys(1000, 900)})
	small.send(prod.id, &protocol.Lookup{KVRequestID: "c", Keys: manyKeys(2000, 10)})
	require.Eventually(t, func() bool {
		for kv := range seenAtHost(prod) {
			seen[kv] = true
		}
		return seen["c"]
	}, 5*time.Second, time.Millisecond, "a lookup within its share was not served")
	assert.False(t, seen["b"], "the lookup over its share reached the host")
	var answer *protocol.LookupResp
	deadline := time.After(5 * time.Second)
	for answer == nil {
		m, ok := b.next(deadline)
		require.True(t, ok, "b's lookup over its share was not answered")
		answer, _ = m.(*protocol.LookupResp)
	}
	assert.Len(t, answer.Keys, 900)
	assert.NotContains(t, answer.Hits, true)
	assert.Contains(t, string(prod.TakeLogs(1<<20)), "over its share of them")
}

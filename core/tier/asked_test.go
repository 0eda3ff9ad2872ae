package tier_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/tier"
)

// kvParams is remote_kv_source naming src under one kv id.
func kvParams(kv string, src *source) []byte {
	return []byte(fmt.Sprintf(`{"remote_kv_source": {"kv_request_id": %q, "remote_url": "tcp://%s"}}`, kv, src.id))
}

// A first ask of keys the kv id has answers for already: a small one (at
// most InlineAsk keys) is answered in the host's call; a larger one is
// answered RETRY at once, registered by the loop, and the answers reach the
// host as changes. Neither sends another lookup on the wire.
func TestFirstAskOfAnAnsweredKVIDIsAnsweredWithoutTheWire(t *testing.T) {
	for _, tc := range []struct {
		name   string
		filler int // keys nobody holds, asked after the three
	}{{"small ask, answered in the call", 0}, {"large ask, answered as changes", tier.InlineAsk}} {
		t.Run(tc.name, func(t *testing.T) {
			r := newMultiRig(t, 1)
			r.srcs[0].hold(0, 1)
			h := newCachingHost(t, r.cons)
			for _, req := range []string{"a", "b"} {
				_, err := r.cons.StartRequest(req, kvParams("kv-shared", r.srcs[0]))
				require.NoError(t, err)
				require.Equal(t, tier.LookupsAsk, r.cons.LookupMode(req))
			}
			ks := keys(append([]int{0, 1, 2}, span(1000, 1000+tc.filler)...)...)
			h.step("a", ks)
			require.Eventually(t, func() bool {
				r.serveAll()
				h.collect()
				return h.answers["a"][string(key(2))] == tier.Miss
			}, 5*time.Second, 2*time.Millisecond)
			require.EqualValues(t, 1, r.srcs[0].Stats().InboundLookups)

			h.step("b", ks)
			if tc.filler == 0 {
				assert.Equal(t, []tier.LookupResult{tier.Hit, tier.Hit, tier.Miss}, h.asked, "answered in the call")
				time.Sleep(20 * time.Millisecond)
				for _, c := range r.cons.TakeAnswers(func(tier.AnswerChange) bool { return true }) {
					assert.NotEqual(t, "b", c.ReqID, "an answer given in the call was queued as a change too")
				}
			} else {
				for _, res := range h.asked {
					require.Equal(t, tier.Retry, res, "a large first ask is answered at once")
				}
			}
			require.Eventually(t, func() bool {
				h.collect()
				return h.answers["b"][string(key(2))] == tier.Miss
			}, 5*time.Second, 2*time.Millisecond)
			assert.Equal(t, []tier.LookupResult{tier.Hit, tier.Hit, tier.Miss}, h.step("b", ks)[:3])
			assert.EqualValues(t, 1, r.srcs[0].Stats().InboundLookups, "b's keys were answered already: nothing more on the wire")
			r.finish("a")
			r.finish("b")
		})
	}
}

// Many requests' first asks in one call, more than the loop registers per
// hold of the lock: every key is answered, at the position the host gave it.
func TestFirstAsksOfManyRequestsAreAllAnswered(t *testing.T) {
	r := newMultiRig(t, 1)
	for k := range 300 {
		r.srcs[0].held[string(key(k))] = k % numRows // rows are only pinned, never read
	}
	h := newCachingHost(t, r.cons)
	const reqs, per = 12, 250 // 3000 keys
	var batch []tier.RequestKeys
	sent := map[string][][]byte{} // each request's keys, as asked
	for i := range reqs {
		req := fmt.Sprintf("r%d", i)
		_, err := r.cons.StartRequest(req, urls(r.srcs[0]))
		require.NoError(t, err)
		require.Equal(t, tier.LookupsAsk, r.cons.LookupMode(req))
		// Request i holds keys i .. i+per-1, then one key nobody has.
		ks := keys(span(i, i+per)...)
		ks = append(ks, key(5000+i))
		batch = append(batch, asking(req, ks))
		h.answers[req] = map[string]tier.LookupResult{}
		h.order[req] = ks
		sent[req] = ks
	}
	out := make([]tier.LookupResult, reqs*(per+1))
	require.NoError(t, r.cons.LookupMany(batch, keyLen, out))
	for _, res := range out {
		require.Equal(t, tier.Retry, res)
	}
	for _, rk := range batch[:len(batch)/2] { // half the requests are held up to a third lookup
		require.Equal(t, []tier.LookupResult{tier.Retry}, r.cons.lookup(rk.ReqID, [][]byte{sent[rk.ReqID][per]}))
	}
	for req, ks := range sent {
		for _, k := range ks {
			h.answers[req][string(k)] = tier.Retry
		}
	}
	last := func(rk tier.RequestKeys) tier.LookupResult { return h.answers[rk.ReqID][string(sent[rk.ReqID][per])] }
	require.Eventually(t, func() bool {
		r.serveAll()
		h.collect()
		for _, rk := range batch {
			if last(rk) != tier.Miss {
				return false
			}
		}
		return true
	}, 10*time.Second, 2*time.Millisecond)
	for _, rk := range batch {
		want := append(allHit(per), tier.Miss)
		assert.Equal(t, want, h.step(rk.ReqID, sent[rk.ReqID]), "request %s", rk.ReqID)
	}
	assert.EqualValues(t, reqs, r.srcs[0].Stats().InboundLookups, "one lookup per request")
	for _, rk := range batch[1:] {
		require.NoError(t, r.cons.FinishRequest(rk.ReqID))
	}
	r.finish(batch[0].ReqID) // then both ends settle and are quiet
}

// A per-key lookup right after a first ask, of its last key first, finds
// every key of the ask at the position the host gave it.
func TestALookupAfterAFirstAskKeepsTheHostsPositions(t *testing.T) {
	r := newMultiRig(t, 1)
	r.srcs[0].hold(0, 1)
	const reqs = 20
	h := newCachingHost(t, r.cons)
	for i := range reqs {
		req := fmt.Sprintf("c%d", i)
		_, err := r.cons.StartRequest(req, urls(r.srcs[0]))
		require.NoError(t, err)
		require.Equal(t, tier.LookupsAsk, r.cons.LookupMode(req))
		h.step(req, keys(0, 1, 2))
		require.Equal(t, []tier.LookupResult{tier.Retry, tier.Retry, tier.Retry}, h.asked)
		// Usually before the loop registered the ask.
		require.Equal(t, []tier.LookupResult{tier.Retry}, r.cons.lookup(req, keys(2)))
	}
	require.Eventually(t, func() bool {
		r.serveAll()
		h.collect()
		for i := range reqs {
			if h.answers[fmt.Sprintf("c%d", i)][string(key(2))] == tier.Retry {
				return false
			}
		}
		return true
	}, 5*time.Second, 2*time.Millisecond)
	for i := range reqs {
		req := fmt.Sprintf("c%d", i)
		assert.Equal(t, []tier.LookupResult{tier.Hit, tier.Hit, tier.Miss}, h.step(req, keys(0, 1, 2)), req)
		if i > 0 {
			require.NoError(t, r.cons.FinishRequest(req))
		}
	}
	r.finish("c0")
}

// A host lookup of a key right after its first ask sees it registered; and
// requests finished before the loop got to their keys leave nothing behind
// at either end.
func TestFirstAskThenLookupOrFinishAtOnce(t *testing.T) {
	r := newMultiRig(t, 1)
	r.srcs[0].hold(0, 1)
	h := newCachingHost(t, r.cons)
	_, err := r.cons.StartRequest("c", urls(r.srcs[0]))
	require.NoError(t, err)
	require.Equal(t, tier.LookupsAsk, r.cons.LookupMode("c"))
	h.step("c", keys(0, 1))
	assert.Equal(t, []tier.LookupResult{tier.Retry, tier.Retry, tier.Retry}, r.cons.lookup("c", keys(0, 1, 2)))
	require.Eventually(t, func() bool {
		r.serveAll()
		return assert.ObjectsAreEqual([]tier.LookupResult{tier.Hit, tier.Hit, tier.Miss}, r.cons.lookup("c", keys(0, 1, 2)))
	}, 5*time.Second, 2*time.Millisecond)
	r.finish("c")

	const reqs = 50
	var batch []tier.RequestKeys
	for i := range reqs {
		req := fmt.Sprintf("gone%d", i)
		_, err := r.cons.StartRequest(req, urls(r.srcs[0]))
		require.NoError(t, err)
		r.cons.LookupMode(req)
		batch = append(batch, asking(req, keys(span(0, 40)...)))
	}
	require.NoError(t, r.cons.LookupMany(batch, keyLen, make([]tier.LookupResult, reqs*40)))
	for _, rk := range batch {
		require.NoError(t, r.cons.FinishRequest(rk.ReqID))
	}
	r.finish("gone0") // finished already: waits for the source to settle, then asserts both ends quiet
}

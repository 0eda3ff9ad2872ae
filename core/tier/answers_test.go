package tier_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/tier"
)

// A host that caches answers, as the Python tier does: vLLM's lookups are
// answered from what it was told; only keys it never asked go to the tier,
// in one LookupMany per step; changes are taken only when the answers
// news count moved.
type cachingHost struct {
	t       *testing.T
	p       *node
	seen    uint64
	answers map[string]map[string]tier.LookupResult // req -> key -> told
	order   map[string][][]byte                     // req -> keys in first-asked order
	failed  map[string]bool
	takes   int
	asked   []tier.LookupResult // what LookupMany answered in the last step that called it
}

func newCachingHost(t *testing.T, p *node) *cachingHost {
	return &cachingHost{t: t, p: p, answers: map[string]map[string]tier.LookupResult{},
		order: map[string][][]byte{}, failed: map[string]bool{}}
}

// step looks ks up for req as vLLM would: told answers from the cache, new
// keys sent in one call.
func (h *cachingHost) step(req string, ks [][]byte) []tier.LookupResult {
	h.collect()
	told := h.answers[req]
	if told == nil {
		told = map[string]tier.LookupResult{}
		h.answers[req] = told
	}
	out := make([]tier.LookupResult, len(ks))
	var ask [][]byte
	for i, k := range ks {
		if h.failed[req] {
			out[i] = tier.Miss
		} else if r, ok := told[string(k)]; ok {
			out[i] = r
		} else {
			ask = append(ask, k)
			out[i] = tier.Retry
		}
	}
	if len(ask) > 0 {
		res := make([]tier.LookupResult, len(ask))
		require.NoError(h.t, h.p.LookupMany([]tier.RequestKeys{asking(req, ask)}, keyLen, res))
		h.asked = res
		for i, k := range ask {
			told[string(k)] = res[i]
			h.order[req] = append(h.order[req], k)
		}
	}
	return out
}

// collect applies changed answers, only when the news count moved.
func (h *cachingHost) collect() {
	n := h.p.News(tier.NewsAnswers)
	if n == h.seen {
		return
	}
	h.seen = n
	h.takes++
	for _, c := range h.p.TakeAnswers(func(tier.AnswerChange) bool { return true }) {
		if c.Failed {
			h.failed[c.ReqID] = true
			continue
		}
		for i, pos := range c.Positions {
			h.answers[c.ReqID][string(h.order[c.ReqID][pos])] = c.Results[i]
		}
	}
}

func TestCachedAnswersArriveWithoutTheHostAskingAgain(t *testing.T) {
	r := newMultiRig(t, 1)
	r.srcs[0].hold(0, 1, 2, 3)
	h := newCachingHost(t, r.cons)
	_, err := r.cons.StartRequest("c", urls(r.srcs[0]))
	require.NoError(t, err)
	require.Equal(t, tier.LookupsAsk, r.cons.LookupMode("c"))
	ks := keys(0, 1, 2, 3, 4, 5)
	assert.Equal(t, []tier.LookupResult{tier.Retry, tier.Retry, tier.Retry, tier.Retry, tier.Retry, tier.Retry}, h.step("c", ks))
	// The host sends nothing more: the lookup went out in LookupMany (or
	// when the handshake finished), and the answers come back as news.
	require.Eventually(t, func() bool {
		r.serveAll()
		h.collect()
		return h.answers["c"][string(key(5))] != tier.Retry
	}, 5*time.Second, 2*time.Millisecond)
	assert.Equal(t, []tier.LookupResult{tier.Hit, tier.Hit, tier.Hit, tier.Hit, tier.Miss, tier.Miss}, h.step("c", ks))
	assert.EqualValues(t, 1, r.srcs[0].Stats().InboundLookups, "one lookup for the whole step")
	assert.LessOrEqual(t, h.takes, 3, "changes are taken only when the news count moves")
	got := r.load("c", 1, []int{0, 1, 2, 3})
	require.True(t, got.Success)
	for k := 0; k < 4; k++ {
		assert.Same(t, r.srcs[0], r.servedBy(k))
	}
	r.finish("c")
}

func TestCachedPrefixWaitsForItsEarlierKeys(t *testing.T) {
	r := newMultiRig(t, 2)
	r.srcs[0].hold(0)
	r.srcs[1].hold(0, 1)
	r.srcs[0].paused = true // source 0 answers late: key 0 stays RETRY at it, key 1 is HIT at 1
	h := newCachingHost(t, r.cons)
	_, err := r.cons.StartRequest("c", urls(r.srcs[0], r.srcs[1]))
	require.NoError(t, err)
	require.Equal(t, tier.LookupsAsk, r.cons.LookupMode("c"))
	ks := keys(0, 1, 2)
	h.step("c", ks)
	require.Eventually(t, func() bool {
		r.serveAll()
		h.collect()
		return h.answers["c"][string(key(2))] == tier.Miss
	}, 5*time.Second, 2*time.Millisecond)
	// Source 1 answered every key: 0 and 1 HIT there, 2 nowhere.
	assert.Equal(t, []tier.LookupResult{tier.Hit, tier.Hit, tier.Miss}, h.step("c", ks))
	r.srcs[0].paused = false
	r.finish("c")
}

func TestCachedLookupsUnansweredBecomeMisses(t *testing.T) {
	r := newMultiRig(t, 1, func(cfg *config.Config) {
		cfg.LookupTimeout = 200 * time.Millisecond
		cfg.InboundLookupTimeout = time.Minute
	})
	r.srcs[0].paused = true
	h := newCachingHost(t, r.cons)
	_, err := r.cons.StartRequest("c", urls(r.srcs[0]))
	require.NoError(t, err)
	require.Equal(t, tier.LookupsAsk, r.cons.LookupMode("c"))
	h.step("c", keys(1, 2))
	require.Eventually(t, func() bool {
		h.collect()
		return h.answers["c"][string(key(2))] == tier.Miss
	}, 5*time.Second, 5*time.Millisecond, "the lookup deadline settles cached RETRY answers")
	assert.Equal(t, []tier.LookupResult{tier.Miss, tier.Miss}, h.step("c", keys(1, 2)))
	r.srcs[0].paused = false
	r.finish("c")
}

func TestCachedPDFailureTellsEveryKeyMiss(t *testing.T) {
	c := newCluster(t)
	prod := c.node(1, func(cfg *config.Config) { cfg.UnboundStoreTimeout = 100 * time.Millisecond })
	dec := c.node(2, func(cfg *config.Config) { cfg.LoadTimeout = 300 * time.Millisecond })
	h := newCachingHost(t, dec)
	_, err := dec.StartRequest("d", pdParams("kv-pd-fail", prod))
	require.NoError(t, err)
	require.Equal(t, tier.LookupsHit, dec.LookupMode("d"))
	// Nothing was ever stored for the kv id: the load fails.
	require.NoError(t, dec.SubmitLoad("d", 7, keys(1), []int64{1}))
	assert.False(t, dec.waitJob(7, 10*time.Second).Success)
	require.Eventually(t, func() bool { h.collect(); return h.failed["d"] }, 3*time.Second, 2*time.Millisecond)
	assert.Equal(t, []tier.LookupResult{tier.Miss}, h.step("d", keys(1)))
	require.NoError(t, dec.FinishRequest("d"))
}

func TestLookupModes(t *testing.T) {
	c := newCluster(t)
	prod, cons := c.node(1), c.node(2)
	_, err := cons.StartRequest("local", nil)
	require.NoError(t, err)
	_, err = cons.StartRequest("pd", pdParams("kv-m1", prod))
	require.NoError(t, err)
	_, err = cons.StartRequest("p2p", p2pParams("kv-m2", prod))
	require.NoError(t, err)
	assert.Equal(t, tier.LookupsMiss, cons.LookupMode("local"))
	assert.Equal(t, tier.LookupsMiss, cons.LookupMode("never-started"))
	assert.Equal(t, tier.LookupsHit, cons.LookupMode("pd"))
	assert.Equal(t, tier.LookupsAsk, cons.LookupMode("p2p"))
	for _, id := range []string{"local", "pd", "p2p"} {
		require.NoError(t, cons.FinishRequest(id))
	}
}

// An idle peer, connected or not, queues nothing for its host: a host that
// reads the news counts makes no call at all.
func TestIdlePeerMakesNoNews(t *testing.T) {
	r := newMultiRig(t, 1)
	r.srcs[0].hold(0)
	_, err := r.cons.StartRequest("c", urls(r.srcs[0]))
	require.NoError(t, err)
	r.lookupSettled("c", keys(0), 3*time.Second) // a live session, used once
	r.finish("c")
	time.Sleep(50 * time.Millisecond) // the terminal fetch lands
	before := [3]uint64{r.cons.News(tier.NewsResults), r.cons.News(tier.NewsAnswers), r.cons.News(tier.NewsInbound)}
	src := [3]uint64{r.srcs[0].News(tier.NewsResults), r.srcs[0].News(tier.NewsAnswers), r.srcs[0].News(tier.NewsInbound)}
	time.Sleep(40 * fastConfig(0).Tick)
	assert.Equal(t, before, [3]uint64{r.cons.News(tier.NewsResults), r.cons.News(tier.NewsAnswers), r.cons.News(tier.NewsInbound)})
	assert.Equal(t, src, [3]uint64{r.srcs[0].News(tier.NewsResults), r.srcs[0].News(tier.NewsAnswers), r.srcs[0].News(tier.NewsInbound)})
}

func TestLookupManyRejectsBadKeysAndChangesNothing(t *testing.T) {
	r := newMultiRig(t, 1)
	_, err := r.cons.StartRequest("c", urls(r.srcs[0]))
	require.NoError(t, err)
	require.Equal(t, tier.LookupsAsk, r.cons.LookupMode("c"))
	short := asking("c", [][]byte{key(1), []byte("short")})
	require.Error(t, r.cons.LookupMany([]tier.RequestKeys{short}, keyLen, make([]tier.LookupResult, 2)))
	require.Error(t, r.cons.LookupMany([]tier.RequestKeys{asking("c", keys(1, 2))}, keyLen-1, make([]tier.LookupResult, 2)))
	require.Error(t, r.cons.LookupMany([]tier.RequestKeys{asking("c", keys(1))}, keyLen, make([]tier.LookupResult, 2)))
	// Nothing was registered: a step end sends no lookup, and no answer is queued.
	require.NoError(t, r.cons.OnScheduleEnd())
	time.Sleep(50 * time.Millisecond)
	assert.Zero(t, r.srcs[0].Stats().InboundLookups)
	assert.Empty(t, r.cons.TakeAnswers(func(tier.AnswerChange) bool { return true }))
	r.finish("c")
}

// A peer that stops (shutdown, or a panic on one of its goroutines) tells a
// caching host that every request still waiting fails: a key it was told
// RETRY would otherwise wait for an answer that can no longer come.
func TestCachedRequestsFailWhenThePeerStops(t *testing.T) {
	r := newMultiRig(t, 1)
	r.srcs[0].paused = true // the answer never comes
	h := newCachingHost(t, r.cons)
	_, err := r.cons.StartRequest("c", urls(r.srcs[0]))
	require.NoError(t, err)
	require.Equal(t, tier.LookupsAsk, r.cons.LookupMode("c"))
	assert.Equal(t, []tier.LookupResult{tier.Retry}, h.step("c", keys(0)))
	require.NoError(t, r.cons.Shutdown())
	h.collect()
	assert.True(t, h.failed["c"], "the request recomputes")
	assert.Equal(t, []tier.LookupResult{tier.Miss}, h.step("c", keys(0)))
}

// What does not fit in one take stays queued and is news again.
func TestAnswersLeftQueuedAreNewsAgain(t *testing.T) {
	r := newMultiRig(t, 1)
	r.srcs[0].hold(0)
	h := newCachingHost(t, r.cons)
	_, err := r.cons.StartRequest("a", urls(r.srcs[0]))
	require.NoError(t, err)
	r.cons.LookupMode("a")
	h.step("a", keys(0))
	refuse := func(tier.AnswerChange) bool { return false }
	require.Eventually(t, func() bool {
		r.serveAll()
		before := r.cons.News(tier.NewsAnswers)
		r.cons.TakeAnswers(refuse) // a host whose buffer fits nothing
		return r.cons.News(tier.NewsAnswers) > before
	}, 5*time.Second, 2*time.Millisecond, "a change left queued moves the news count again")
	h.seen = 0
	h.collect()
	assert.Equal(t, tier.Hit, h.answers["a"][string(key(0))])
	before := r.cons.News(tier.NewsAnswers)
	assert.Empty(t, r.cons.TakeAnswers(refuse))
	assert.Equal(t, before, r.cons.News(tier.NewsAnswers), "nothing left: no news")
	r.finish("a")
}

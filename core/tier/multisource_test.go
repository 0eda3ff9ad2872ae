package tier_test

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/tier"
	"github.com/peerkv/peerkv/tests/hostsim"
)

// Pulls from several sources (remote_kv_source as a list). Each source
// fills its rows with a pattern of its own, so the consumer's rows show
// byte for byte which source served each key.

// source is a producer and what its host holds (key -> row).
type source struct {
	*node
	tag    int
	held   map[string]int
	paused bool // its host does not serve inbound lookups (a busy engine)
}

type multiRig struct {
	t    *testing.T
	c    *cluster
	cons *node
	srcs []*source
	pins int64
}

func newMultiRig(t *testing.T, n int, mutate ...func(*config.Config)) *multiRig {
	c := newCluster(t)
	r := &multiRig{t: t, c: c, cons: c.node(0, mutate...), pins: 1000}
	for i := 1; i <= n; i++ {
		r.srcs = append(r.srcs, &source{node: c.node(i, mutate...), tag: i, held: map[string]int{}})
	}
	return r
}

// hold makes s hold keys idx, key k in row k, filled with s's own pattern.
func (s *source) hold(idx ...int) *source {
	for _, k := range idx {
		s.fill(k, key(10000*s.tag+k))
		s.held[string(key(k))] = k
	}
	return s
}

func span(from, to int) []int {
	var out []int
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

// urls is remote_kv_source as a list of URL strings (ids left to the consumer).
func urls(srcs ...*source) []byte {
	var items []string
	for _, s := range srcs {
		items = append(items, fmt.Sprintf("%q", "tcp://"+s.id))
	}
	return []byte(`{"remote_kv_source": [` + strings.Join(items, ", ") + `]}`)
}

func (r *multiRig) serveAll() {
	for _, s := range r.srcs {
		if !s.paused {
			s.serve(s.held, &r.pins)
		}
	}
}

// lookupSettled looks ks up once per step until no answer is RETRY.
func (r *multiRig) lookupSettled(req string, ks [][]byte, within time.Duration) []tier.LookupResult {
	got, err := hostsim.Settle(r.cons.Tier, req, ks, within, r.serveAll)
	require.NoError(r.t, err)
	return got
}

// lookupAll is lookupSettled once every serving source answered the
// request's first lookup, so the load can spread over all of them (a HIT
// does not wait for slower sources).
func (r *multiRig) lookupAll(req string, ks [][]byte) []tier.LookupResult {
	serving := 0
	for _, s := range r.srcs {
		if !s.paused {
			serving++
		}
	}
	require.Eventually(r.t, func() bool {
		r.cons.lookup(req, ks)
		require.NoError(r.t, r.cons.OnScheduleEnd())
		queued := 0
		for _, s := range r.srcs {
			if !s.paused && s.Stats().InboundQueued > 0 {
				queued++
			}
		}
		return queued == serving
	}, 3*time.Second, 2*time.Millisecond, "every source gets the lookup")
	answers := func() (n int64) {
		for _, c := range r.cons.Stats().LookupRTT.Counts {
			n += c
		}
		return n
	}
	before := answers()
	r.serveAll()
	// Counting answers, not frames: another frame (a data-path hello) must
	// not let the load start before a source's answer made it a holder.
	require.Eventually(r.t, func() bool { return answers() >= before+int64(serving) }, 3*time.Second,
		time.Millisecond, "every answer arrives")
	return r.lookupSettled(req, ks, 3*time.Second)
}

// stepUntilLookedUp runs host steps (lookup, step end) until every source
// holds exactly one inbound lookup of the request, none served.
func (r *multiRig) stepUntilLookedUp(req string, ks [][]byte) {
	require.Eventually(r.t, func() bool {
		r.cons.lookup(req, ks)
		require.NoError(r.t, r.cons.OnScheduleEnd())
		for _, s := range r.srcs {
			if s.Stats().InboundLookups != 1 {
				return false
			}
		}
		return true
	}, 3*time.Second, 2*time.Millisecond)
}

// waitLoad waits (bounded) for a load's single report, serving the sources
// meanwhile (a failover looks keys up again).
func (r *multiRig) waitLoad(id int64, within time.Duration) tier.JobResult {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		r.serveAll()
		r.cons.collect()
		if res, ok := r.cons.seen[id]; ok {
			return res
		}
		time.Sleep(2 * time.Millisecond)
	}
	require.FailNow(r.t, "load not reported", "job %d within %v", id, within)
	return tier.JobResult{}
}

// load submits keys idx into rows idx and waits for its report.
func (r *multiRig) load(req string, job int64, idx []int) tier.JobResult {
	ks, slots := make([][]byte, len(idx)), make([]int64, len(idx))
	for i, k := range idx {
		ks[i], slots[i] = key(k), int64(k)
	}
	require.NoError(r.t, r.cons.SubmitLoad(req, job, ks, slots))
	return r.waitLoad(job, 5*time.Second)
}

// servedBy says which source's bytes consumer row k holds (nil: none).
func (r *multiRig) servedBy(k int) *source {
	for _, s := range r.srcs {
		if _, held := s.held[string(key(k))]; held && r.cons.rowEquals(k, s.node, k) {
			return s
		}
	}
	return nil
}

// finish ends the request and checks that nothing is left anywhere and
// every source's pinned rows were released.
func (r *multiRig) finish(req string) {
	require.NoError(r.t, r.cons.FinishRequest(req))
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) && r.busy() {
		r.serveAll()
		time.Sleep(2 * time.Millisecond)
	}
	peers := []*node{r.cons}
	for _, s := range r.srcs {
		peers = append(peers, s.node)
	}
	assertQuiet(r.t, peers...)
}

func (r *multiRig) busy() bool {
	for _, s := range r.srcs {
		if st := s.Stats(); st.JobsInFlight > 0 || st.InboundActive > 0 {
			return true
		}
	}
	return false
}

func allHit(n int) []tier.LookupResult {
	out := make([]tier.LookupResult, n)
	for i := range out {
		out[i] = tier.Hit
	}
	return out
}

// rowsBy counts the consumer rows each source served, in source order.
func (r *multiRig) rowsBy(idx []int) []int {
	out := make([]int, len(r.srcs))
	for _, k := range idx {
		s := r.servedBy(k)
		require.NotNil(r.t, s, "row %d holds no source's bytes", k)
		out[s.tag-1]++
	}
	return out
}

func TestTwoSourcesHoldingAllShareTheLoad(t *testing.T) {
	r := newMultiRig(t, 2)
	all := span(0, 48)
	r.srcs[0].hold(all...)
	r.srcs[1].hold(all...)
	_, err := r.cons.StartRequest("c", urls(r.srcs...))
	require.NoError(t, err)
	assert.Equal(t, allHit(48), r.lookupAll("c", keys(all...)))

	res := r.load("c", 1, all)
	require.True(t, res.Success)
	assert.EqualValues(t, 48*rowLen, res.Bytes)
	// Chunks of 16 in the orchestrator's order: 0-15 and 32-47 from the
	// first source, 16-31 from the second.
	for _, k := range all {
		want := r.srcs[0]
		if k >= 16 && k < 32 {
			want = r.srcs[1]
		}
		require.Same(t, want, r.servedBy(k), "row %d", k)
	}
	assert.EqualValues(t, 1, r.cons.Stats().LoadsSpread)
	r.finish("c")
	assert.EqualValues(t, 32*rowLen, r.srcs[0].Stats().BytesOut)
	assert.EqualValues(t, 16*rowLen, r.srcs[1].Stats().BytesOut, "no row was sent twice")
}

func TestThreeSourcesShareALongPrefixEvenly(t *testing.T) {
	r := newMultiRig(t, 3)
	all := span(0, 48)
	for _, s := range r.srcs {
		s.hold(all...)
	}
	_, err := r.cons.StartRequest("c", urls(r.srcs...))
	require.NoError(t, err)
	assert.Equal(t, allHit(48), r.lookupAll("c", keys(all...)))
	require.True(t, r.load("c", 1, all).Success)
	assert.Equal(t, []int{16, 16, 16}, r.rowsBy(all))
	r.finish("c")
	for _, s := range r.srcs {
		assert.EqualValues(t, 16*rowLen, s.Stats().BytesOut)
	}
}

func TestAShortPrefixStaysWithTheFirstSource(t *testing.T) {
	r := newMultiRig(t, 2)
	r.srcs[0].hold(span(0, 10)...)
	r.srcs[1].hold(span(0, 10)...)
	_, err := r.cons.StartRequest("c", urls(r.srcs...))
	require.NoError(t, err)
	r.lookupAll("c", keys(span(0, 10)...))
	require.True(t, r.load("c", 1, span(0, 10)).Success)
	assert.Equal(t, []int{10, 0}, r.rowsBy(span(0, 10)), "the orchestrator's first choice serves a short prefix alone")
	assert.Zero(t, r.cons.Stats().LoadsSpread)
	r.finish("c")
}

// A source whose every reported key landed (from another source) holds
// pins no fetch will read: they go once the load lands, while the request
// goes on, and the source is asked nothing more for it.
func TestASourceTheLoadDidNotUseReleasesItsPinsOnceTheLoadLands(t *testing.T) {
	r := newMultiRig(t, 2)
	r.srcs[0].hold(span(0, 10)...)
	r.srcs[1].hold(span(0, 10)...)
	_, err := r.cons.StartRequest("c", urls(r.srcs...))
	require.NoError(t, err)
	r.lookupAll("c", keys(span(0, 10)...))
	unused := r.srcs[1]
	require.EqualValues(t, 1, unused.Stats().JobsInFlight, "its answer pinned the rows it holds")

	require.True(t, r.load("c", 1, span(0, 10)).Success)
	require.Equal(t, []int{10, 0}, r.rowsBy(span(0, 10)))
	require.Eventually(t, func() bool {
		st := unused.Stats()
		return st.JobsInFlight == 0 && st.InboundActive == 0
	}, 3*time.Second, 2*time.Millisecond, "the unused source still pins rows: %+v", unused.Stats())
	unused.collect()
	require.Len(t, unused.seen, 1, "the unused source's host got its pin job back")
	for _, pin := range unused.seen {
		assert.False(t, pin.Success, "nothing was fetched from it")
	}

	// The request goes on: a key asked now goes to the source that served it.
	r.srcs[0].hold(10)
	unused.hold(10)
	got := r.lookupSettled("c", keys(10), 3*time.Second)
	assert.Equal(t, allHit(1), got)
	assert.EqualValues(t, 1, unused.Stats().InboundLookups, "the released source is asked nothing more")
	r.finish("c")
}

// Keys past the end of the cached prefix are never loaded, so what the
// sources say of them does not keep a source whose hits landed.
func TestAPromptLongerThanTheCachedPrefixStillReleasesTheUnusedSource(t *testing.T) {
	r := newMultiRig(t, 2)
	r.srcs[0].hold(span(0, 10)...)
	r.srcs[1].hold(span(0, 10)...)
	_, err := r.cons.StartRequest("c", urls(r.srcs...))
	require.NoError(t, err)
	got := r.lookupAll("c", keys(span(0, 11)...))
	require.Equal(t, allHit(10), got[:10])
	// Keys asked once the prefix is known to end are MISS here and now:
	// no source is asked about them.
	for _, res := range r.cons.lookup("c", keys(span(11, 16)...)) {
		require.Equal(t, tier.Miss, res)
	}
	unused := r.srcs[1]
	require.EqualValues(t, 1, unused.Stats().JobsInFlight, "its answer pinned the rows it holds")

	require.True(t, r.load("c", 1, span(0, 10)).Success)
	require.Eventually(t, func() bool {
		st := unused.Stats()
		return st.JobsInFlight == 0 && st.InboundActive == 0
	}, 3*time.Second, 2*time.Millisecond, "the unused source still pins rows: %+v", unused.Stats())
	r.finish("c")
}

func TestDisjointHoldingsMakeOnePrefix(t *testing.T) {
	r := newMultiRig(t, 3)
	r.srcs[0].hold(span(0, 10)...)
	r.srcs[1].hold(span(10, 20)...)
	r.srcs[2].hold(span(21, 30)...) // after key 20, which nobody holds
	_, err := r.cons.StartRequest("c", urls(r.srcs...))
	require.NoError(t, err)
	got := r.lookupAll("c", keys(span(0, 30)...))
	want := append(allHit(20), tier.Miss)
	for range 9 {
		want = append(want, tier.Miss) // beyond the first key nobody has: recomputed, not pulled
	}
	assert.Equal(t, want, got)
	require.True(t, r.load("c", 1, span(0, 20)).Success)
	assert.Equal(t, []int{10, 10, 0}, r.rowsBy(span(0, 20)))
	r.finish("c")
	assert.Zero(t, r.srcs[2].Stats().BytesOut)
}

func TestOverlappingHoldingsAreSpreadWhereTheyOverlap(t *testing.T) {
	r := newMultiRig(t, 2)
	r.srcs[0].hold(span(0, 20)...)
	r.srcs[1].hold(span(10, 40)...)
	_, err := r.cons.StartRequest("c", urls(r.srcs...))
	require.NoError(t, err)
	assert.Equal(t, allHit(40), r.lookupAll("c", keys(span(0, 40)...)))
	require.True(t, r.load("c", 1, span(0, 40)).Success)
	for k := range 10 {
		require.Same(t, r.srcs[0], r.servedBy(k), "row %d only the first holds", k)
	}
	for k := 20; k < 40; k++ {
		require.Same(t, r.srcs[1], r.servedBy(k), "row %d only the second holds", k)
	}
	assert.Equal(t, []int{16, 24}, r.rowsBy(span(0, 40)), "the first takes a whole chunk, the second the rest")
	r.finish("c")
}

// A host may load a request's HIT keys in several jobs (vLLM 0.32 promotes
// the keys that turned HIT in each step as one job). The first job's fetch
// closes the source's lookup round, and with it what the source reported
// in that round for the other keys: the later job looks them up again
// there and loads them, instead of failing for want of a source.
func TestALaterLoadOfKeysReportedBeforeAnEarlierLoadsFetchIsServed(t *testing.T) {
	r := newMultiRig(t, 2)
	r.srcs[0].hold(span(0, 30)...)
	r.srcs[1].hold(span(10, 40)...)
	_, err := r.cons.StartRequest("c", urls(r.srcs...))
	require.NoError(t, err)
	assert.Equal(t, allHit(40), r.lookupAll("c", keys(span(0, 40)...)))
	require.True(t, r.load("c", 1, span(0, 30)).Success, "the first job: keys both sources reported")
	require.True(t, r.load("c", 2, span(30, 40)).Success, "the second job: keys only the second source holds")
	for k := 30; k < 40; k++ {
		require.Same(t, r.srcs[1], r.servedBy(k), "row %d", k)
	}
	r.finish("c")
}

func TestAKeyWaitsForEarlierKeysToSettle(t *testing.T) {
	r := newMultiRig(t, 2)
	r.srcs[0].hold(append(span(0, 5), span(6, 10)...)...)
	r.srcs[1].hold(5)
	r.srcs[1].paused = true
	_, err := r.cons.StartRequest("c", urls(r.srcs...))
	require.NoError(t, err)
	ks := keys(span(0, 10)...)
	want := append(allHit(5), tier.Retry, tier.Retry, tier.Retry, tier.Retry, tier.Retry)
	require.Eventually(t, func() bool {
		got := r.cons.lookup("c", ks)
		require.NoError(t, r.cons.OnScheduleEnd())
		r.serveAll()
		return assert.ObjectsAreEqual(want, got)
	}, 3*time.Second, 2*time.Millisecond,
		"key 5: the first source said no, the second has not answered; keys 6-9, which the first holds, are not HIT before it")
	r.srcs[1].paused = false
	assert.Equal(t, allHit(10), r.lookupSettled("c", ks, 3*time.Second))
	require.True(t, r.load("c", 1, span(0, 10)).Success)
	assert.Same(t, r.srcs[1], r.servedBy(5))
	r.finish("c")
}

func TestLookupsGoToEverySourceInOneStep(t *testing.T) {
	r := newMultiRig(t, 3)
	_, err := r.cons.StartRequest("c", urls(r.srcs...))
	require.NoError(t, err)
	ks := keys(span(0, 8)...)
	assert.Equal(t, []tier.LookupResult{tier.Retry, tier.Retry, tier.Retry, tier.Retry, tier.Retry, tier.Retry, tier.Retry, tier.Retry},
		r.cons.lookup("c", ks))
	r.stepUntilLookedUp("c", ks)
	for _, s := range r.srcs {
		in, ok, taken := s.NextInbound(nil)
		require.True(t, ok && taken)
		assert.Len(t, in.Keys, 8, "one lookup with every key, per source")
		results := []tier.LookupResult{tier.Miss, tier.Miss, tier.Miss, tier.Miss, tier.Miss, tier.Miss, tier.Miss, tier.Miss}
		_, err = s.AnswerInbound(in.LookupID, results, -1, nil)
		require.NoError(t, err)
	}
	assert.Equal(t, []tier.LookupResult{tier.Miss, tier.Miss, tier.Miss, tier.Miss, tier.Miss, tier.Miss, tier.Miss, tier.Miss},
		r.lookupSettled("c", ks, 3*time.Second))
	r.finish("c")
}

func TestOneSourceDownTheOthersServe(t *testing.T) {
	r := newMultiRig(t, 2)
	all := span(0, 20)
	r.srcs[1].hold(all...)
	r.c.ctl.Kill(r.srcs[0].id) // the orchestrator's first choice is gone
	_, err := r.cons.StartRequest("c", urls(r.srcs...))
	require.NoError(t, err)
	start := time.Now()
	assert.Equal(t, allHit(20), r.lookupSettled("c", keys(all...), 3*time.Second))
	assert.Less(t, time.Since(start), time.Second, "a dead source answers nothing and is not waited for")
	require.True(t, r.load("c", 1, all).Success)
	assert.Equal(t, []int{0, 20}, r.rowsBy(all))
	require.NoError(t, r.cons.FinishRequest("c"))
	assertQuiet(t, r.cons, r.srcs[1].node)
}

func TestASlowSourceDoesNotHoldThePullBack(t *testing.T) {
	r := newMultiRig(t, 2)
	all := span(0, 32)
	r.srcs[0].hold(all...)
	r.srcs[1].hold(all...)
	r.srcs[1].paused = true // busy: its lookups wait for its host
	_, err := r.cons.StartRequest("c", urls(r.srcs...))
	require.NoError(t, err)
	assert.Equal(t, allHit(32), r.lookupSettled("c", keys(all...), 3*time.Second))
	require.True(t, r.load("c", 1, all).Success)
	assert.Equal(t, []int{32, 0}, r.rowsBy(all), "only the source that answered serves")
	r.srcs[1].paused = false // it answers late, naming only keys that landed: its pins go at once
	late := r.srcs[1]
	require.Eventually(t, func() bool {
		r.serveAll()
		st := late.Stats()
		return st.InboundLookups == 1 && st.JobsInFlight == 0 && st.InboundActive == 0
	}, 3*time.Second, 2*time.Millisecond, "the late source still pins rows: %+v", late.Stats())
	r.finish("c")
	assert.Zero(t, r.srcs[1].Stats().BytesOut)
}

// A load that lands before a slower source answered does not end that
// source: the keys only it has come from it in a later load.
func TestASourceThatHasKeysNotLoadedYetKeepsServing(t *testing.T) {
	r := newMultiRig(t, 2)
	r.srcs[0].hold(span(0, 30)...)
	r.srcs[1].hold(span(10, 40)...)
	r.srcs[1].paused = true
	_, err := r.cons.StartRequest("c", urls(r.srcs...))
	require.NoError(t, err)
	all := keys(span(0, 40)...)
	require.Eventually(t, func() bool {
		got := r.cons.lookup("c", all)
		require.NoError(t, r.cons.OnScheduleEnd())
		r.serveAll()
		return assert.ObjectsAreEqual(allHit(30), got[:30])
	}, 3*time.Second, 2*time.Millisecond, "the answered source's prefix is HIT")
	require.True(t, r.load("c", 1, span(0, 30)).Success)
	assert.Equal(t, []int{30, 0}, r.rowsBy(span(0, 30)))

	r.srcs[1].paused = false // the host asks on about the keys it has not loaded
	assert.Equal(t, allHit(10), r.lookupSettled("c", all[30:], 3*time.Second), "keys 30-39 are only at the slower source")
	require.True(t, r.load("c", 2, span(30, 40)).Success)
	assert.Equal(t, []int{0, 10}, r.rowsBy(span(30, 40)))
	r.finish("c")
}

func TestASourceFailingMidLoadFailsOver(t *testing.T) {
	r := newMultiRig(t, 2)
	all := span(0, 48)
	r.srcs[0].hold(all...)
	r.srcs[1].hold(all...)
	const stall = 500 * time.Millisecond
	r.c.data.SetDelayFrom(r.srcs[0].id, stall)
	_, err := r.cons.StartRequest("c", urls(r.srcs...))
	require.NoError(t, err)
	r.lookupAll("c", keys(all...))
	ks, slots := keys(all...), make([]int64, len(all))
	for i := range slots {
		slots[i] = int64(i)
	}
	require.NoError(t, r.cons.SubmitLoad("c", 1, ks, slots))
	time.Sleep(100 * time.Millisecond) // the second source's part landed; the first's is on its way
	r.c.ctl.Kill(r.srcs[0].id)
	res := r.waitLoad(1, 3*time.Second)
	require.True(t, res.Success, "the second source serves the first one's keys")
	assert.EqualValues(t, 48*rowLen, res.Bytes)
	assert.Equal(t, []int{0, 48}, r.rowsBy(all))
	assert.EqualValues(t, 1, r.cons.Stats().SourceFailovers)
	time.Sleep(stall) // the first source's stalled writes arrive now
	assert.Equal(t, []int{0, 48}, r.rowsBy(all), "a failed source's late writes are refused")
	require.NoError(t, r.cons.FinishRequest("c"))
	assertQuiet(t, r.cons, r.srcs[1].node)
	assert.Len(t, r.cons.seen, 1, "one job, reported once")
}

func TestFailoverIsBoundedByTheLoadDeadline(t *testing.T) {
	r := newMultiRig(t, 2)
	all := span(0, 48)
	r.srcs[0].hold(all...)
	r.srcs[1].hold(all...)
	r.c.data.SetDelayFrom(r.srcs[0].id, 500*time.Millisecond)
	_, err := r.cons.StartRequest("c", urls(r.srcs...))
	require.NoError(t, err)
	r.lookupAll("c", keys(all...))
	ks, slots := keys(all...), make([]int64, len(all))
	for i := range slots {
		slots[i] = int64(i)
	}
	start := time.Now()
	require.NoError(t, r.cons.SubmitLoad("c", 1, ks, slots))
	// Both parts were asked once the second source's chunk (rows 16-31)
	// landed; its answers from before that fetch no longer count, so the
	// failover asks it again.
	require.Eventually(t, func() bool { return r.srcs[1].Stats().BytesOut == 16*rowLen }, time.Second,
		time.Millisecond, "the second source's chunk lands")
	r.srcs[1].paused = true // the second source never answers the failover's lookup
	r.c.ctl.Kill(r.srcs[0].id)
	res := r.waitLoad(1, 5*time.Second)
	assert.False(t, res.Success)
	took := time.Since(start)
	assert.Less(t, took, 2*time.Second+time.Second+500*time.Millisecond, "load_timeout_s + abort_ack_timeout_s bound it")
	assert.Equal(t, []tier.LookupResult{tier.Miss}, r.cons.lookup("c", keys(0)), "the request recomputes")
	require.NoError(t, r.cons.FinishRequest("c"))
	assertQuiet(t, r.cons)
}

func TestEverySourceFailingFailsTheLoadOnce(t *testing.T) {
	r := newMultiRig(t, 2)
	all := span(0, 32)
	r.srcs[0].hold(all...)
	r.srcs[1].hold(all...)
	_, err := r.cons.StartRequest("c", urls(r.srcs...))
	require.NoError(t, err)
	r.lookupAll("c", keys(all...))
	r.c.data.SetFail(r.cons.id, true) // every write into the consumer fails
	res := r.load("c", 1, all)
	assert.False(t, res.Success)
	assert.Equal(t, []tier.LookupResult{tier.Miss}, r.cons.lookup("c", keys(0)))
	r.c.data.SetFail(r.cons.id, false)
	r.finish("c")
	assert.Len(t, r.cons.seen, 1)
}

var mintedID = regexp.MustCompile(`peerkv-[0-9a-f]{32}`)

func TestConsumerMintsAKVRequestIDPerSource(t *testing.T) {
	r := newMultiRig(t, 2)
	r.srcs[0].hold(0)
	r.srcs[1].hold(0)
	_, err := r.cons.StartRequest("c", urls(r.srcs...))
	require.NoError(t, err)
	logs := string(r.cons.TakeLogs(1 << 16))
	ids := mintedID.FindAllString(logs, -1)
	require.Len(t, ids, 2, logs)
	assert.NotEqual(t, ids[0], ids[1])
	assert.Contains(t, logs, "kv_request_id="+ids[0]+", minted")
	// The ids are what goes on the wire: each producer sees its own.
	r.stepUntilLookedUp("c", keys(0))
	for i, s := range r.srcs {
		in, ok, _ := s.NextInbound(nil)
		require.True(t, ok)
		assert.Contains(t, in.ReqID, ":"+ids[i]+":", "source %d", i)
		_, err := s.AnswerInbound(in.LookupID, []tier.LookupResult{tier.Miss}, -1, nil)
		require.NoError(t, err)
	}
	_, err = r.cons.StartRequest("c2", urls(r.srcs...))
	require.NoError(t, err)
	again := mintedID.FindAllString(string(r.cons.TakeLogs(1<<16)), -1)
	require.Len(t, again, 2)
	assert.NotContains(t, ids, again[0], "every request gets fresh ids")
	assert.EqualValues(t, 4, r.cons.Stats().KVIDsMinted)
	require.NoError(t, r.cons.FinishRequest("c2"))
	r.finish("c")
}

func TestGivenKVRequestIDsAreKept(t *testing.T) {
	r := newMultiRig(t, 2)
	params := fmt.Sprintf(`{"remote_kv_source": [{"kv_request_id": "mine-1", "remote_url": "tcp://%s"},
		{"kv_request_id": "mine-2", "remote_host": "127.0.0.1", "remote_port": %s}]}`, r.srcs[0].id, r.srcs[1].id[len("127.0.0.1:"):])
	_, err := r.cons.StartRequest("c", []byte(params))
	require.NoError(t, err)
	r.stepUntilLookedUp("c", keys(0))
	for i, s := range r.srcs {
		in, ok, _ := s.NextInbound(nil)
		require.True(t, ok)
		assert.Contains(t, in.ReqID, fmt.Sprintf(":mine-%d:", i+1))
		_, err := s.AnswerInbound(in.LookupID, []tier.LookupResult{tier.Miss}, -1, nil)
		require.NoError(t, err)
	}
	assert.Zero(t, r.cons.Stats().KVIDsMinted)
	r.finish("c")
}

func TestTooManySourcesAreRefused(t *testing.T) {
	c := newCluster(t)
	p := c.node(0)
	five := `{"remote_kv_source": ["tcp://127.0.0.1:7001", "tcp://127.0.0.1:7002", "tcp://127.0.0.1:7003", "tcp://127.0.0.1:7004", "tcp://127.0.0.1:7005"]}`
	_, err := p.StartRequest("r", []byte(five))
	require.ErrorIs(t, err, tier.ErrBadParams)
	assert.Contains(t, err.Error(), "lists 5 sources; this node takes at most 4 (option max_sources_per_request)")
	assert.EqualValues(t, 1, p.Stats().BadParams)
	assert.Equal(t, []tier.LookupResult{tier.Miss}, p.lookup("r", keys(1)))

	wide := c.node(9, func(cfg *config.Config) { cfg.MaxSourcesPerRequest = 5 })
	_, err = wide.StartRequest("r", []byte(five))
	require.NoError(t, err)
	require.NoError(t, wide.FinishRequest("r"))
}

func TestRemoteDecoderWithSeveralKVSources(t *testing.T) {
	r := newMultiRig(t, 2)
	all := span(0, 32)
	r.srcs[0].hold(all...)
	r.srcs[1].hold(all...)
	params := `{"remote_decoder": {"kv_request_id": "pd-9"}, "remote_kv_source": ` + string(urls(r.srcs...)[len(`{"remote_kv_source": `):])
	pol, err := r.cons.StartRequest("pre", []byte(params))
	require.NoError(t, err)
	assert.Equal(t, tier.RequestLevel, pol)
	r.lookupAll("pre", keys(all...))
	require.True(t, r.load("pre", 1, all).Success)
	assert.Equal(t, []int{16, 16}, r.rowsBy(all))
	r.finish("pre")
}

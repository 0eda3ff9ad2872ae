package tier_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/tier"
)

// The calls vLLM's scheduler thread makes every step return at once while
// a goroutine holds the tier's lock (as one preempted while holding it
// would), and nothing they could not collect is lost: once the lock is let
// go, the news count moves again and the next call collects it, once.
func TestStepCallsDoNotWaitForALockAGoroutineHolds(t *testing.T) {
	c := newCluster(t)
	p := c.node(1)
	p.GateWaits()
	const req = "req-1"
	_, err := p.StartRequest(req, nil)
	require.NoError(t, err)
	require.NoError(t, p.SubmitStore(req, 7, keys(0), []int64{0})) // nothing to serve: reported at once
	before := p.News(tier.NewsResults)

	release := p.HoldLock()
	const bound = 100 * time.Millisecond // the wait is 1 ms; generous for a loaded machine
	took := map[string]time.Duration{}
	timed := func(name string, call func()) {
		start := time.Now()
		call()
		took[name] = time.Since(start)
	}
	calls := make(chan struct{})
	go func() {
		defer close(calls)
		timed("GetFinished", func() { assert.Empty(t, p.GetFinished(64)) })
		timed("TakeAnswers", func() { assert.Empty(t, p.TakeAnswers(func(tier.AnswerChange) bool { return true })) })
		timed("NextInbound", func() {
			_, ok, _ := p.NextInbound(nil)
			assert.False(t, ok)
		})
		timed("Lookup", func() {
			assert.Equal(t, []tier.LookupResult{tier.Retry, tier.Retry}, p.lookup(req, keys(1, 2)))
		})
		timed("OnScheduleEnd", func() { assert.NoError(t, p.OnScheduleEnd()) })
		timed("HasPendingWork", func() { assert.True(t, p.HasPendingWork()) })
	}()
	select {
	case <-calls:
	case <-time.After(2 * time.Second):
		release()
		<-calls
		t.Fatalf("host calls waited for the lock a goroutine held (%v)", took)
	}
	for name, d := range took {
		assert.Less(t, d, bound, "%s waited for the lock", name)
	}
	assert.EqualValues(t, 6, p.HostCallsDeferred())
	time.Sleep(50 * time.Millisecond) // ticks come and go: the loop waits for the lock too
	release()

	require.Eventually(t, func() bool { return p.News(tier.NewsResults) != before }, 5*time.Second, time.Millisecond,
		"the results a call could not collect were not told again")
	got := p.GetFinished(64)
	require.Len(t, got, 1)
	assert.EqualValues(t, 7, got[0].JobID)
	assert.True(t, got[0].Success)
	assert.Empty(t, p.GetFinished(64), "reported once")
	assert.Equal(t, []tier.LookupResult{tier.Miss}, p.lookup(req, keys(1)), "a request that does not pull answers MISS again")
}

// A caching host's LookupMany made while a goroutine holds the lock is
// answered RETRY at once; once the lock is let go, its keys are registered
// and asked as the call would have, and their answers reach the host as
// changes, at the positions it asked them in (after the keys it asked
// before).
func TestLookupsAskedWhileTheLockIsHeldArriveAsChanges(t *testing.T) {
	r := newMultiRig(t, 1)
	r.cons.GateWaits()
	r.srcs[0].hold(0, 1, 2)
	h := newCachingHost(t, r.cons)
	_, err := r.cons.StartRequest("a", kvParams("kv-a", r.srcs[0]))
	require.NoError(t, err)
	require.Equal(t, tier.LookupsAsk, r.cons.LookupMode("a"))
	h.step("a", keys(0)) // asked with the lock free

	deferred := r.cons.HostCallsDeferred()
	release := r.cons.HoldLock()
	stepped := make(chan time.Duration)
	go func() {
		start := time.Now()
		h.step("a", keys(0, 1, 2, 3))
		stepped <- time.Since(start)
	}()
	select {
	case took := <-stepped:
		release()
		assert.Less(t, took, 100*time.Millisecond, "LookupMany waited for the lock")
	case <-time.After(2 * time.Second):
		release()
		<-stepped
		t.Fatal("LookupMany waited for the lock a goroutine held")
	}
	assert.Equal(t, []tier.LookupResult{tier.Retry, tier.Retry, tier.Retry}, h.asked, "keys 1-3, answered at once")
	assert.Greater(t, r.cons.HostCallsDeferred(), deferred, "the step's LookupMany did without the lock")

	want := []tier.LookupResult{tier.Hit, tier.Hit, tier.Hit, tier.Miss}
	require.Eventually(t, func() bool {
		r.serveAll()
		h.collect()
		return assert.ObjectsAreEqual(want, h.step("a", keys(0, 1, 2, 3)))
	}, 5*time.Second, 2*time.Millisecond, "answers told: %v", h.answers["a"])
	r.finish("a")
}

// A caching host re-asks keys it asked before (vllm.py resets its answers
// after a load); when that LookupMany finds the lock held it is told RETRY,
// and a change must follow.
func TestKeysAskedAgainWhileTheLockIsHeldArriveAsChanges(t *testing.T) {
	r := newMultiRig(t, 1)
	r.cons.GateWaits()
	r.srcs[0].hold(0, 1, 2, 3)
	h := newCachingHost(t, r.cons)
	_, err := r.cons.StartRequest("a", kvParams("kv-a", r.srcs[0]))
	require.NoError(t, err)
	require.Equal(t, tier.LookupsAsk, r.cons.LookupMode("a"))
	h.step("a", keys(0, 1))
	require.Eventually(t, func() bool {
		r.serveAll()
		h.collect()
		return h.answers["a"][string(key(1))] == tier.Hit
	}, 5*time.Second, 2*time.Millisecond)

	// The host forgets its answers (as after a load) and asks again, gated.
	delete(h.answers, "a")
	release := r.cons.HoldLock()
	done := make(chan struct{})
	go func() { h.step("a", keys(0, 1)); close(done) }()
	select {
	case <-done:
		release()
	case <-time.After(2 * time.Second):
		release()
		<-done
		t.Fatal("LookupMany waited for the lock a goroutine held")
	}
	require.Equal(t, []tier.LookupResult{tier.Retry, tier.Retry}, h.asked, "asked while the lock was held")
	ok := false
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		r.serveAll()
		h.collect()
		if h.answers["a"][string(key(0))] != tier.Retry && h.answers["a"][string(key(1))] != tier.Retry {
			ok = true
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	require.True(t, ok, "keys re-asked under the gate stay RETRY: %v", h.answers["a"])
	r.finish("a")
}

// Host calls do without the lock only so long: a goroutine that keeps it
// (or Go's mutex handing it to its waiters in turn, which no TryLock can
// take) makes the first call past the bound wait for it, so results are
// collected at most that late, each once.
func TestAHostCallWithoutTheLockForLongWaitsForIt(t *testing.T) {
	c := newCluster(t)
	p := c.node(1)
	const bound = 50 * time.Millisecond
	p.GateJoinsWaitersAfter(bound)
	const req = "req-1"
	_, err := p.StartRequest(req, nil)
	require.NoError(t, err)
	require.NoError(t, p.SubmitStore(req, 7, keys(0), []int64{0})) // reported at once

	release := p.HoldLock()
	held := time.Now()
	got := make(chan []tier.JobResult)
	go func() {
		for {
			if r := p.GetFinished(64); r != nil {
				got <- r
				return
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	time.Sleep(4 * bound)
	select {
	case r := <-got:
		release()
		t.Fatalf("collected %v while the lock was held", r)
	default:
	}
	release()
	var r []tier.JobResult
	select {
	case r = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the results were never collected")
	}
	require.Len(t, r, 1)
	assert.EqualValues(t, 7, r[0].JobID)
	assert.Empty(t, p.GetFinished(64), "reported once")
	deferred := p.HostCallsDeferred()
	assert.Greater(t, deferred, int64(0), "calls did without the lock first")
	assert.Less(t, deferred, int64(4*bound/(2*time.Millisecond)), "then one waited for it: %v held", time.Since(held))
}

// The host's answer to an inbound lookup, made while a goroutine holds the
// producer's lock, returns at once as not finished; once the lock is let
// go it is applied (the consumer gets its HITs, the pins are served and
// reported once), and the host is given the Finish item it is then owed.
func TestAnAnswerMadeWhileTheLockIsHeldIsAppliedAndFinished(t *testing.T) {
	r, src, in := evaluating(t)
	ks := keys(0, 1)

	const pinJob = 4242
	release := src.HoldLock()
	answered := make(chan bool)
	go func() {
		finished, err := src.AnswerInbound(in.LookupID, []tier.LookupResult{tier.Hit, tier.Hit}, pinJob, []int64{0, 1})
		assert.NoError(t, err)
		answered <- finished
	}()
	select {
	case finished := <-answered:
		release()
		assert.False(t, finished, "not finished: a Finish item follows")
	case <-time.After(2 * time.Second):
		release()
		<-answered
		t.Fatal("AnswerInbound waited for the lock a goroutine held")
	}

	var finish tier.Inbound
	require.Eventually(t, func() bool {
		it, ok, _ := src.NextInbound(nil)
		if ok && it.Kind == tier.InboundFinish && it.LookupID == in.LookupID {
			finish = it
		}
		return finish.Kind == tier.InboundFinish
	}, 5*time.Second, 2*time.Millisecond, "the host was never given the lookup's Finish item")
	assert.Equal(t, in.ReqID, finish.ReqID)
	require.Eventually(t, func() bool {
		return assert.ObjectsAreEqual([]tier.LookupResult{tier.Hit, tier.Hit}, r.cons.lookup("a", ks))
	}, 5*time.Second, 2*time.Millisecond, "the consumer never got the answer")

	require.NoError(t, r.cons.FinishRequest("a")) // the pins are released with the request
	src.waitJob(pinJob, 5*time.Second)            // reported
	time.Sleep(20 * time.Millisecond)
	src.collect() // fails on a second report
}

// An inbound lookup whose request the consumer ends while the host
// evaluates it ends exactly once for the host: by the answer's "finished"
// (answered with the lock free) or by one Finish item (answered while a
// goroutine held the lock); its pins are reported once either way.
func TestAnInboundLookupEndedWhileEvaluatedEndsOnce(t *testing.T) {
	for _, held := range []bool{false, true} {
		t.Run(map[bool]string{false: "lock free", true: "lock held"}[held], func(t *testing.T) {
			r, src, in := evaluating(t)
			require.NoError(t, r.cons.FinishRequest("a")) // its terminal fetch drops the lookup at the source
			require.Eventually(t, func() bool { return src.Stats().InboundActive == 0 }, 5*time.Second, 2*time.Millisecond)

			const pinJob = 4242
			release := func() {}
			if held {
				release = src.HoldLock()
			}
			finished, err := src.AnswerInbound(in.LookupID, []tier.LookupResult{tier.Hit, tier.Hit}, pinJob, []int64{0, 1})
			release()
			require.NoError(t, err)
			assert.Equal(t, !held, finished)
			finishes := 0
			deadline := time.Now().Add(300 * time.Millisecond)
			for time.Now().Before(deadline) {
				if it, ok, _ := src.NextInbound(nil); ok && it.Kind == tier.InboundFinish && it.LookupID == in.LookupID {
					finishes++
				}
				time.Sleep(2 * time.Millisecond)
			}
			ends := finishes
			if finished {
				ends++
			}
			assert.Equal(t, 1, ends, "finished=%v and %d Finish items", finished, finishes)
			res := src.waitJob(pinJob, 5*time.Second)
			assert.False(t, res.Success, "nothing was served: the pins are released as failed")
			time.Sleep(20 * time.Millisecond)
			src.collect() // fails on a second report
		})
	}
}

// The bound on doing without the lock counts calls that keep missing it,
// not the time since the first miss: after an idle gap, a call that finds
// the lock held returns at once again.
func TestAMissAfterAnIdleGapDoesNotWaitForTheLock(t *testing.T) {
	c := newCluster(t)
	p := c.node(1)
	p.GateJoinsWaitersAfter(50 * time.Millisecond)
	release := p.HoldLock()
	p.GetFinished(64) // a miss
	release()
	time.Sleep(200 * time.Millisecond) // idle: no host call
	release = p.HoldLock()
	done := make(chan time.Duration)
	go func() {
		start := time.Now()
		p.GetFinished(64)
		done <- time.Since(start)
	}()
	select {
	case took := <-done:
		release()
		assert.Less(t, took, 100*time.Millisecond)
	case <-time.After(2 * time.Second):
		release()
		<-done
		t.Fatal("the first miss after an idle gap waited for the lock")
	}
}

// evaluating is a consumer's request "a" asking keys 0 and 1 of a source
// that holds them (its host calls gated), and the Evaluate item the source's
// host was handed for that lookup.
func evaluating(t *testing.T) (*multiRig, *source, tier.Inbound) {
	r := newMultiRig(t, 1)
	src := r.srcs[0]
	src.GateWaits()
	src.hold(0, 1)
	_, err := r.cons.StartRequest("a", kvParams("kv-a", src))
	require.NoError(t, err)
	var in tier.Inbound
	require.Eventually(t, func() bool {
		r.cons.lookup("a", keys(0, 1))
		require.NoError(t, r.cons.OnScheduleEnd())
		var ok bool
		in, ok, _ = src.NextInbound(nil)
		return ok && in.Kind == tier.InboundEvaluate
	}, 5*time.Second, 2*time.Millisecond, "the source never got the lookup")
	return r, src, in
}

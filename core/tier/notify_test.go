package tier_test

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/peerkv/peerkv/core/tier"
)

// notifyFD opens p's notification fd and closes it with the test (after the
// cluster's Shutdown cleanup, which runs first: cleanups are LIFO).
func (p *node) notifyFD() int {
	fd, err := p.NotifyFD()
	require.NoError(p.t, err)
	require.GreaterOrEqual(p.t, fd, 0)
	p.t.Cleanup(func() { _ = p.CloseNotify() })
	return fd
}

// readable polls fd for up to within.
func readable(t *testing.T, fd int, within time.Duration) bool {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		ms := int(time.Until(deadline) / time.Millisecond)
		n, err := unix.Poll(pfd, max(ms, 0))
		if errors.Is(err, unix.EINTR) {
			continue
		}
		require.NoError(t, err)
		if n > 0 {
			require.Zero(t, pfd[0].Revents&(unix.POLLERR|unix.POLLNVAL), "revents %#x", pfd[0].Revents)
			return pfd[0].Revents&unix.POLLIN != 0
		}
		return false
	}
}

// consume reads the counter (resetting it) and returns its value.
func consume(t *testing.T, fd int) uint64 {
	t.Helper()
	var buf [8]byte
	n, err := unix.Read(fd, buf[:])
	require.NoError(t, err)
	require.Equal(t, 8, n)
	return binary.NativeEndian.Uint64(buf[:])
}

func TestNotifyFDIsQuietOnAFreshTierAndStable(t *testing.T) {
	c := newCluster(t)
	p := c.node(1)
	fd := p.notifyFD()
	again, err := p.NotifyFD()
	require.NoError(t, err)
	assert.Equal(t, fd, again, "every call returns the same fd")
	assert.False(t, readable(t, fd, 50*time.Millisecond), "nothing to collect yet")
	assert.Empty(t, p.GetFinished(16))
	assert.Empty(t, p.GetFinished(0))
	_, ok, _ := p.NextInbound(nil)
	assert.False(t, ok)
	assert.False(t, readable(t, fd, 50*time.Millisecond), "collecting nothing signals nothing")
	// A request that serves nobody and a lookup produce nothing to collect.
	_, err = p.StartRequest("r", nil)
	require.NoError(t, err)
	p.lookup("r", keys(1))
	require.NoError(t, p.OnScheduleEnd())
	assert.False(t, readable(t, fd, 50*time.Millisecond))
}

func TestNotifyFDSignalsInboundLookupsReofferedKeysAndFinishedJobs(t *testing.T) {
	c := newCluster(t)
	prod, cons := c.node(1), c.node(2)
	prodFD, consFD := prod.notifyFD(), cons.notifyFD()
	ks := keys(0, 1)
	prod.fill(30, ks[0])

	_, err := cons.StartRequest("c", p2pParams("kv-notify", prod))
	require.NoError(t, err)
	assert.False(t, readable(t, prodFD, 20*time.Millisecond))

	// The consumer's lookup arrives (sent by the first step after its
	// handshake): the producer's fd wakes it, with nothing else calling in.
	require.Eventually(t, func() bool {
		assert.Equal(t, []tier.LookupResult{tier.Retry, tier.Retry}, cons.lookup("c", ks))
		require.NoError(t, cons.OnScheduleEnd())
		return readable(t, prodFD, 5*time.Millisecond)
	}, 3*time.Second, time.Millisecond, "an inbound lookup was queued")
	assert.NotZero(t, consume(t, prodFD))
	assert.False(t, readable(t, prodFD, 0), "reading resets it")
	in, ok, taken := prod.NextInbound(nil)
	require.True(t, ok && taken)
	require.Equal(t, tier.InboundEvaluate, in.Kind)
	require.Len(t, in.Keys, 2)

	// HIT_PENDING: the key is offered again in the next pass, and the fd says so.
	done, err := prod.AnswerInbound(in.LookupID, []tier.LookupResult{tier.HitPending, tier.Miss}, -1, nil)
	require.NoError(t, err)
	require.False(t, done)
	require.True(t, readable(t, prodFD, time.Second), "a re-offer was queued")
	consume(t, prodFD)
	_, ok, _ = prod.NextInbound(nil) // ends this pass
	require.False(t, ok)
	in, ok, taken = prod.NextInbound(nil)
	require.True(t, ok && taken, "the re-offer is there after the wake-up")
	require.Equal(t, [][]byte{ks[0]}, in.Keys)
	done, err = prod.AnswerInbound(in.LookupID, []tier.LookupResult{tier.Hit}, 900, []int64{30})
	require.NoError(t, err)
	require.True(t, done)
	_, ok, _ = prod.NextInbound(nil)
	require.False(t, ok)
	assert.False(t, readable(t, prodFD, 20*time.Millisecond), "an answered lookup queues nothing")

	require.Eventually(t, func() bool {
		r := cons.lookup("c", ks)
		return r[0] == tier.Hit && r[1] == tier.Miss
	}, 3*time.Second, 5*time.Millisecond)
	assert.False(t, readable(t, consFD, 0), "the consumer has nothing to collect yet")

	// A submitted job finishes: both ends' fds wake for their job results.
	require.NoError(t, cons.SubmitLoad("c", 1, ks[:1], []int64{5}))
	require.True(t, readable(t, consFD, 3*time.Second), "the load's result was queued")
	consume(t, consFD)
	got := cons.GetFinished(16)
	require.Len(t, got, 1)
	assert.True(t, got[0].Success)
	assert.True(t, cons.rowEquals(5, prod, 30))
	assert.Empty(t, cons.GetFinished(16))
	assert.False(t, readable(t, consFD, 50*time.Millisecond), "an empty get_finished signals nothing")

	require.True(t, readable(t, prodFD, 3*time.Second), "the pin job's result was queued")
	consume(t, prodFD)
	require.Eventually(t, func() bool {
		for _, r := range prod.GetFinished(16) {
			if r.JobID == 900 {
				return true
			}
		}
		return false
	}, time.Second, time.Millisecond)
	require.NoError(t, cons.FinishRequest("c"))
	assertQuiet(t, prod, cons)
}

func TestNotifyFDSignalsWhatWasQueuedBeforeItWasOpened(t *testing.T) {
	c := newCluster(t)
	p := c.node(1)
	_, err := p.StartRequest("plain", nil)
	require.NoError(t, err)
	require.NoError(t, p.SubmitStore("plain", 7, keys(1), []int64{0})) // reported at once
	fd := p.notifyFD()
	assert.True(t, readable(t, fd, 0), "a result queued before the first call is not missed")
}

func TestNotifyFDSignalsShutdownAndOutlivesIt(t *testing.T) {
	c := newCluster(t)
	p := c.node(1)
	fd := p.notifyFD()
	require.False(t, readable(t, fd, 20*time.Millisecond))
	require.NoError(t, p.Shutdown())
	require.True(t, readable(t, fd, 0), "shutdown wakes the host once")
	assert.EqualValues(t, 1, consume(t, fd), "one signal: no jobs were failed")
	again, err := p.NotifyFD()
	require.NoError(t, err)
	assert.Equal(t, fd, again, "shutdown does not close it")
	require.NoError(t, p.Shutdown())
	assert.False(t, readable(t, fd, 20*time.Millisecond), "a repeated shutdown is not news")

	require.NoError(t, p.CloseNotify())
	require.NoError(t, p.CloseNotify(), "idempotent")
	_, err = p.NotifyFD()
	require.ErrorIs(t, err, tier.ErrClosed)
	var buf [8]byte
	_, err = unix.Read(fd, buf[:])
	// Closed: EBADF, unless the test binary reused the number meanwhile.
	if err != nil {
		assert.ErrorIs(t, err, unix.EBADF)
	}
}

func TestNotifyFDSignalsShutdownOfAPeerOpenedAfterIt(t *testing.T) {
	c := newCluster(t)
	p := c.node(1)
	require.NoError(t, p.Shutdown())
	assert.True(t, readable(t, p.notifyFD(), 0), "a stopped peer's fd is readable from the start")
}

func TestNotifyFDSignalsPoison(t *testing.T) {
	c := newCluster(t)
	p := c.node(1)
	fd := p.notifyFD()
	require.False(t, readable(t, fd, 20*time.Millisecond))
	tier.PanicNext("loop") // its next tick panics
	require.True(t, readable(t, fd, 3*time.Second), "a poisoned peer wakes the host")
	assert.NotEmpty(t, p.Stats().Poisoned)
}

// A host that sleeps on the fd between steps (as a C embedder may) must be
// woken when the answers it is waiting for arrive, not at its next timeout.
func TestNotifyFDSignalsChangedAnswers(t *testing.T) {
	r := newMultiRig(t, 1)
	r.srcs[0].hold(0, 1)
	h := newCachingHost(t, r.cons)
	fd := r.cons.notifyFD()
	_, err := r.cons.StartRequest("c", urls(r.srcs[0]))
	require.NoError(t, err)
	require.Equal(t, tier.LookupsAsk, r.cons.LookupMode("c"), "the host caches answers")
	ks := keys(0, 1, 2)
	h.step("c", ks)
	require.NoError(t, r.cons.OnScheduleEnd())
	require.Eventually(t, func() bool {
		r.serveAll()
		return readable(t, fd, 2*time.Millisecond)
	}, 2*time.Second, time.Millisecond, "the answers arrived without a signal")
	consume(t, fd)
	h.collect()
	assert.Equal(t, []tier.LookupResult{tier.Hit, tier.Hit, tier.Miss}, h.step("c", ks), "the signal came with every answer")
	assert.False(t, readable(t, fd, 20*time.Millisecond), "taking the answers queues nothing")
	r.finish("c")
}

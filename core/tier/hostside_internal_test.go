package tier

import (
	"errors"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// readable says whether the eventfd has a signal to read (and takes it).
func readable(t *testing.T, fd int) bool {
	t.Helper()
	var buf [8]byte
	_, err := unix.Read(fd, buf[:])
	if errors.Is(err, unix.EAGAIN) {
		return false
	}
	require.NoError(t, err)
	return true
}

// What the host is told without a call: news counts for each kind, the
// fd made readable only when asked to wake it, and everything at once
// when the node stops.
func TestHostSideTellsNewsAndWakesOnlyWhenAsked(t *testing.T) {
	clock := newLedgerClock()
	h := newHostSide(clock.now)
	fd, _, err := h.notify.get()
	require.NoError(t, err)
	t.Cleanup(func() { _ = h.notify.Close() })

	h.tell(NewsAnswers, false)
	assert.Equal(t, uint64(1), h.news.w[NewsAnswers].Load())
	assert.False(t, readable(t, fd), "answers changed within a host call do not wake the host")

	h.tell(NewsResults, true)
	assert.Equal(t, uint64(1), h.news.w[NewsResults].Load())
	assert.True(t, readable(t, fd), "a job result wakes the host")

	h.stopped()
	for k := NewsKind(0); k < NewsKinds; k++ {
		assert.NotZero(t, h.news.w[k].Load(), "kind %d: the host collects every kind once the node stops", k)
	}
	assert.True(t, readable(t, fd), "the host is woken when the node stops")
}

// A cause logs logBurst lines a window; the rest are summed up once the
// window is over (flushLogs), and INFO lines of our own are never limited.
func TestHostSideLimitsEachCauseAndReportsWhatItSuppressed(t *testing.T) {
	clock := newLedgerClock()
	h := newHostSide(clock.now)
	for i := range logBurst + 5 {
		h.logf("WARNING", "flood %d", i)
	}
	for i := range logBurst + 5 {
		h.logf("INFO", "ours %d", i)
	}
	logs := string(h.log.ring.take(1 << 20))
	assert.Equal(t, logBurst, strings.Count(logs, "WARNING flood"))
	assert.Equal(t, logBurst+5, strings.Count(logs, "INFO ours"))
	seen := h.news.w[NewsLogs].Load()
	assert.NotZero(t, seen)

	h.flushLogs(clock.now())
	assert.Empty(t, h.log.ring.take(1<<20), "nothing is summed up before the window is over")
	clock.advance(logWindow)
	h.flushLogs(clock.now())
	summary := string(h.log.ring.take(1 << 20))
	assert.Contains(t, summary, "flood 14 (5 lines like this suppressed")
	assert.Greater(t, h.news.w[NewsLogs].Load(), seen, "the summary is news for the host")
}

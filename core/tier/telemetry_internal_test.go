package tier

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/peerkv/peerkv/core/session"
)

// What the telemetry was told is what Stats shows: loads and stores by
// data path (failed loads move no bytes; a store that moved none is no
// store), rejections by cause with the transport's own refusals added,
// load times by outcome.
func TestTelemetryFillsStatsFromWhatItWasTold(t *testing.T) {
	m := newTelemetry()
	m.attribute(session.Report{Kind: session.LoadDone, OK: true, Rows: []uint64{1, 2, 3}}, "tcp", 64)
	m.attribute(session.Report{Kind: session.LoadDone, Rows: []uint64{4}}, "tcp", 64)
	m.attribute(session.Report{Kind: session.StoreDone, OK: true, Bytes: 128}, "shm", 64)
	m.attribute(session.Report{Kind: session.StoreDone, OK: true}, "shm", 64)
	m.fellBack("tcp")
	m.rejected(CauseLimit)
	m.rejected(CauseNotAllowed)
	m.loadTook(true, 2*time.Millisecond)
	m.loadTook(false, time.Second)
	m.stats.framesIn = 7
	m.stats.integrityMissing = 1

	var st Stats
	m.fill(&st, 2)
	assert.Equal(t, PathStats{Loads: 1, LoadFailures: 1, BytesIn: 192, Fallbacks: 1}, st.Paths["tcp"])
	assert.Equal(t, PathStats{Stores: 1, BytesOut: 128}, st.Paths["shm"])
	assert.Equal(t, map[string]int64{CauseLimit: 1, CauseNotAllowed: 3}, st.HandshakeRejections)
	assert.Equal(t, int64(7), st.FramesIn)
	assert.Equal(t, map[string]int64{IntegrityMismatch: 0, IntegrityMissing: 1}, st.IntegrityFailures)
	assert.Equal(t, int64(1), sum(st.LoadSeconds["ok"].Counts))
	assert.Equal(t, int64(1), sum(st.LoadSeconds["failed"].Counts))

	// A snapshot is a copy: what is told later does not change it.
	m.fellBack("tcp")
	assert.Equal(t, int64(1), st.Paths["tcp"].Fallbacks)
}

// The per-peer list is due at first, then once per peersEvery after one
// reached the host.
func TestTelemetryPerPeerListIsDueOncePerPeriod(t *testing.T) {
	m := newTelemetry()
	at := time.Unix(1_790_000_000, 0)
	assert.True(t, m.peersDue(at))
	m.peersSent(at)
	assert.False(t, m.peersDue(at.Add(peersEvery/2)))
	assert.True(t, m.peersDue(at.Add(peersEvery)))
}

func sum(xs []int64) int64 {
	n := int64(0)
	for _, x := range xs {
		n += x
	}
	return n
}

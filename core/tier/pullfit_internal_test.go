package tier

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fetch is the duration of a fetch of n bytes over a link with fixed cost
// t0 and rate bps.
func fetch(t0 time.Duration, bps float64, n int64) time.Duration {
	return t0 + time.Duration(float64(n)/bps*float64(time.Second))
}

// Fetches of several sizes over a 2 ms, 4.5 GB/s link give back 2 ms and
// 4.5 GB/s; the newest fetch's age and the sample count come with them.
func TestThePullFitRecoversFixedCostAndRate(t *testing.T) {
	var f pullFit
	clock := time.Unix(1000, 0)
	for i := range 40 {
		n := int64(1+i%8) << 20 // 1..8 MiB
		d := fetch(2*time.Millisecond, 4.5e9, n)
		if i%2 == 0 { // ±3 % noise
			d = d * 103 / 100
		} else {
			d = d * 97 / 100
		}
		clock = clock.Add(100 * time.Millisecond)
		f.add(clock, n, d)
	}
	m := f.model(clock.Add(time.Second))
	assert.InDelta(t, 0.002, m.T0, 0.0002)
	assert.InEpsilon(t, 4.5e9, m.BytesPerS, 0.05)
	assert.Equal(t, 40, m.Samples)
	assert.InDelta(t, 1.0, m.AgeS, 1e-9)
	assert.Less(t, m.ThroughputBytesPerS, m.BytesPerS, "the fixed cost lowers what a fetch moves per second")
}

// The window is bounded and the newest fetches weigh most: after the link
// slowed, the model follows it.
func TestThePullFitFollowsALinkThatChanged(t *testing.T) {
	var f pullFit
	clock := time.Unix(1000, 0)
	for i := range 3 * pullWindow {
		bps := 10e9
		if i >= 2*pullWindow { // the last window: a slower link
			bps = 1e9
		}
		n := int64(1+i%4) << 20
		clock = clock.Add(time.Second)
		f.add(clock, n, fetch(time.Millisecond, bps, n))
	}
	m := f.model(clock)
	assert.Equal(t, pullWindow, m.Samples)
	assert.InEpsilon(t, 1e9, m.BytesPerS, 0.01)
	assert.InDelta(t, 0.001, m.T0, 1e-5)
}

// Too few fetches, or all of one size, give no fixed cost: t0 0 and the
// plain ratio; none gives an empty model.
func TestThePullFitWithTooFewSamples(t *testing.T) {
	var f pullFit
	clock := time.Unix(1000, 0)
	assert.Equal(t, PullModel{}, f.model(clock))

	f.add(clock, 1<<20, 2*time.Millisecond)
	f.add(clock, 2<<20, 3*time.Millisecond)
	m := f.model(clock)
	assert.Equal(t, 2, m.Samples)
	assert.Zero(t, m.T0)
	assert.InEpsilon(t, float64(3<<20)/0.005, m.BytesPerS, 1e-9)

	var same pullFit
	for range 10 {
		same.add(clock, 1<<20, time.Millisecond)
	}
	m = same.model(clock)
	assert.Zero(t, m.T0)
	assert.InEpsilon(t, float64(1<<20)/0.001, m.BytesPerS, 1e-9)

	// Nonsense is not a sample.
	same.add(clock, 0, time.Millisecond)
	same.add(clock, 1, 0)
	require.Equal(t, 10, same.model(clock).Samples)
}

// p50 and p99 are nearest-rank quantiles of the newest round trips.
func TestTheLinkRTTQuantilesComeFromTheNewestRoundTrips(t *testing.T) {
	var l link
	for range rttWindow {
		l.observeRTT(time.Second) // pushed out by what follows
	}
	for i := 1; i <= 100; i++ {
		l.observeRTT(time.Duration(i) * time.Millisecond)
	}
	v := l.snapshot(time.Unix(0, 0))
	assert.Equal(t, rttWindow, v.RTTSamples)
	assert.InDelta(t, 0.064, v.RTTP50, 1e-9, "28 of the 128 are still 1 s")
	assert.InDelta(t, 1.0, v.RTTP99, 1e-9)
	for i := 101; i <= 128; i++ {
		l.observeRTT(time.Duration(i) * time.Millisecond)
	}
	v = l.snapshot(time.Unix(0, 0))
	assert.InDelta(t, 0.064, v.RTTP50, 1e-9)
	assert.InDelta(t, 0.127, v.RTTP99, 1e-9)
	assert.Equal(t, map[string]int64{FailTransfer: 0, FailAborted: 0, FailBadFrame: 0}, v.Failures)
}

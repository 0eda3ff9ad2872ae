package tier

import (
	"math"
	"time"
)

// The pull-cost model a router reads per peer: T_pull(L) = t0 + L/bytes_per_s,
// fitted on the peer's recent completed fetches (bytes L, duration from the
// fetch sent to its last row landed). docs/links.md says how to use it.

const (
	// pullWindow is how many recent fetches the fit keeps per peer.
	pullWindow = 64
	// pullHalfLife: a fetch this much older than now weighs half as much,
	// so the model follows a link whose speed changed within minutes.
	pullHalfLife = time.Minute
	// pullFitMin is how many fetches the two-parameter fit needs; with
	// fewer it reports t0 = 0 and bytes_per_s = Σbytes/Σseconds.
	pullFitMin = 3
)

// pullSample is one completed fetch.
type pullSample struct {
	at      time.Time
	bytes   float64
	seconds float64
}

// pullFit is a ring of a peer's recent fetches; owned by its peer entry.
type pullFit struct {
	ring [pullWindow]pullSample
	n    int // samples held (≤ pullWindow)
	next int // where the next one goes
}

func (f *pullFit) add(at time.Time, bytes int64, d time.Duration) {
	if bytes <= 0 || d <= 0 {
		return
	}
	f.ring[f.next] = pullSample{at: at, bytes: float64(bytes), seconds: d.Seconds()}
	f.next = (f.next + 1) % pullWindow
	if f.n < pullWindow {
		f.n++
	}
}

// PullModel is the fitted pull cost, as each peer's "link" entry lists it.
type PullModel struct {
	// T0 is the fixed cost of one fetch in seconds, BytesPerS the rate
	// after it: a fetch of L bytes takes T0 + L/BytesPerS.
	T0        float64 `json:"pull_t0_s"`
	BytesPerS float64 `json:"pull_bytes_per_s"`
	// Samples is how many fetches the fit used (0: no model, both 0;
	// below pullFitMin: T0 is 0 and BytesPerS the plain ratio).
	Samples int `json:"pull_samples"`
	// AgeS is how long ago the newest of them completed.
	AgeS float64 `json:"pull_age_s"`
	// ThroughputBytesPerS is the weighted Σbytes/Σseconds of the same
	// fetches: what the link moved while a fetch was in flight.
	ThroughputBytesPerS float64 `json:"throughput_bytes_per_s"`
}

// model fits T = t0 + beta·L by least squares, each fetch weighted
// 2^(-age/pullHalfLife). A fit that comes out unphysical (time falling
// with size, or t0 < 0, both noise of same-sized fetches) falls back to a
// line through the origin.
func (f *pullFit) model(now time.Time) PullModel {
	if f.n == 0 {
		return PullModel{}
	}
	var sw, sl, st, sll, slt float64
	newest := f.ring[0].at
	for i := 0; i < f.n; i++ {
		s := f.ring[i]
		if s.at.After(newest) {
			newest = s.at
		}
		w := math.Exp2(-now.Sub(s.at).Seconds() / pullHalfLife.Seconds())
		sw += w
		sl += w * s.bytes
		st += w * s.seconds
		sll += w * s.bytes * s.bytes
		slt += w * s.bytes * s.seconds
	}
	m := PullModel{Samples: f.n, AgeS: now.Sub(newest).Seconds(), ThroughputBytesPerS: sl / st}
	m.BytesPerS = m.ThroughputBytesPerS
	if f.n < pullFitMin {
		return m
	}
	// Centred sums: the variance of L and its covariance with T.
	varL := sll/sw - (sl/sw)*(sl/sw)
	cov := slt/sw - (sl/sw)*(st/sw)
	if varL <= 1e-9*(sl/sw)*(sl/sw) { // every fetch the same size: no slope to fit
		return m
	}
	beta := cov / varL
	t0 := st/sw - beta*sl/sw
	if beta <= 0 || t0 < 0 {
		if slt > 0 { // through the origin: T = beta·L
			m.BytesPerS = sll / slt
		}
		return m
	}
	m.T0, m.BytesPerS = t0, 1/beta
	return m
}

package zmqctl

import (
	"testing"
	"time"

	"github.com/peerkv/peerkv/core/control"
)

// BenchmarkRoundTrip measures a frame going A→B and back over loopback.
func BenchmarkRoundTrip(b *testing.B) {
	a := newTestTransport(b, Options{})
	echo := newTestTransport(b, Options{})
	go func() {
		for ev := range echo.Events() {
			if ev.Kind == control.EventFrame {
				_ = echo.Send(ev.PeerID, ev.Frame)
			}
		}
	}()
	frame := make([]byte, 256) // a typical msgpack control message
	roundTrip := func() {
		if err := a.Send(echo.LocalID(), frame); err != nil {
			b.Fatal(err)
		}
		select {
		case ev := <-a.Events():
			if ev.Kind != control.EventFrame {
				b.Fatalf("unexpected event %+v", ev)
			}
		case <-time.After(5 * time.Second):
			b.Fatal("round trip timed out")
		}
	}
	roundTrip() // connect both DEALERs outside the timing
	b.ResetTimer()
	start, n := time.Now(), 0
	for b.Loop() {
		roundTrip()
		n++
	}
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "roundtrips/s")
}

package faults

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/protocol"
	"github.com/peerkv/peerkv/core/tier"
)

// prepare starts mode's request up to its load: PD with the rows stored
// first, P2P once every key answered HIT.
func (e *env) prepare(mode string, prod, cons *Node) (string, [][]byte) {
	kv := uniq("pull")
	keys := keysFor(kv, 4)
	req := "c-" + kv
	if mode == "pd" {
		e.prefill(prod, kv, keys)
		_, err := cons.StartRequest(req, prefillerParams(kv, prod))
		require.NoError(e.t, err)
	} else {
		rows := e.rows(prod, len(keys))
		for i, k := range keys {
			prod.Hold(k, rows[i])
		}
		_, err := cons.StartRequest(req, sourceParams(kv, prod))
		require.NoError(e.t, err)
		require.NotContains(e.t, e.probe(cons, req, keys), tier.Miss, "the producer holds every key")
	}
	return req, keys
}

// TestProducerKilledMidTransfer: the producer vanishes while its write is
// in flight. The load fails at once (the connection is lost), the stalled
// write is refused when it lands, and a producer restarted on the same id
// serves the next request.
func TestProducerKilledMidTransfer(t *testing.T) {
	for _, mode := range []string{"pd", "p2p"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			prod, cons := e.open(prodPort), e.open(consPort)
			const stall = 800 * time.Millisecond
			e.c.Data.SetDelay(stall)
			req, keys := e.prepare(mode, prod, cons)
			p := e.submitLoad(cons, req, keys)
			e.eventually(func() bool { return prod.Wire.Seen(In, protocol.TypeFetch) > 0 }, loadBound,
				says("the fetch never reached the producer"))
			e.idle(50 * time.Millisecond) // the write is in flight
			killed := time.Now()
			e.c.Ctl.Kill(prod.ID)
			p = e.settle(cons, p, e.wait(p.job, loadBound))
			require.False(t, p.ok)
			require.Less(t, time.Since(killed), loadBound)
			e.idle(time.Until(p.start.Add(stall + 200*time.Millisecond)))
			e.checkUntouched(cons, p.slots)
			require.NoError(t, cons.FinishRequest(req))
			e.c.Data.SetDelay(0)

			e.eventually(func() bool { return prod.Stats().JobsInFlight == 0 }, jobsBound,
				says("the killed producer still holds its job"))
			e.shutdown(prod)
			prod = e.open(prodPort)
			require.True(t, e.run(mode, prod, cons).ok, "the restarted producer serves")
			e.finish()
		})
	}
}

// TestProducerPaused: every frame of the producer is held past the load
// deadline (outbound only, or both ways as a stopped process), then let
// go. The load fails once, by its deadlines; the late transfer_done and
// abort_ack are ignored; a late write is refused.
func TestProducerPaused(t *testing.T) {
	for _, mode := range []string{"pd", "p2p"} {
		for name, dirs := range map[string]Dir{"out": Out, "both": In | Out} {
			t.Run(mode+"/"+name, func(t *testing.T) {
				t.Parallel()
				e := newEnv(t)
				prod, cons := e.open(prodPort), e.open(consPort)
				require.True(t, e.run(mode, prod, cons).ok, "warm-up: the handshake is done before the pause")
				lateBefore := cons.Wire.Seen(In, protocol.TypeTransferDone) + cons.Wire.Seen(In, protocol.TypeAbortAck)

				req, keys := e.prepare(mode, prod, cons)
				prod.Wire.Pause(dirs)
				p := e.submitLoad(cons, req, keys)
				p = e.settle(cons, p, e.wait(p.job, loadBound))
				require.False(t, p.ok, "the paused producer never confirmed")
				require.GreaterOrEqual(t, p.took, 3*time.Second-50*time.Millisecond, "failed by load + abort-ack timeouts")
				e.idle(time.Until(p.start.Add(3500 * time.Millisecond)))
				require.Positive(t, prod.Wire.Applied(Hold))

				prod.Wire.Release()
				e.eventually(func() bool {
					return cons.Wire.Seen(In, protocol.TypeTransferDone)+cons.Wire.Seen(In, protocol.TypeAbortAck) > lateBefore
				}, 2*time.Second, says("no late transfer_done or abort_ack came"))
				e.idle(200 * time.Millisecond)
				if dirs&In != 0 {
					e.checkUntouched(cons, p.slots) // its fetch came after the load failed
				}
				require.NoError(t, cons.FinishRequest(req))
				e.drain(prod, cons)
				require.True(t, e.run(mode, prod, cons).ok, "the pair works after the pause")
				e.finish()
			})
		}
	}
}

// TestPeerRestartOnSameID: a producer shut down (idle, or with a load on
// it: a PD fetch waiting for its prefill, a P2P write in flight) and
// started again under the same id on the same hubs serves the consumer's
// next requests, with its own rows.
func TestPeerRestartOnSameID(t *testing.T) {
	for _, mode := range []string{"pd", "p2p"} {
		for _, busy := range []bool{false, true} {
			name := mode + "/idle"
			if busy {
				name = mode + "/load_in_flight"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				e := newEnv(t)
				prod, cons := e.open(prodPort), e.open(consPort)
				require.True(t, e.run(mode, prod, cons).ok)
				var p pull
				var req string
				switch {
				case busy && mode == "pd": // a decoder whose prefill has not started
					kv := uniq("waiting")
					req = "d-" + kv
					_, err := cons.StartRequest(req, prefillerParams(kv, prod))
					require.NoError(t, err)
					p = e.submitLoad(cons, req, keysFor(kv, 4))
					e.eventually(func() bool { return prod.Stats().ServeKeysWanted == 4 }, loadBound,
						says("the fetch never reached the producer"))
				case busy:
					var keys [][]byte
					req, keys = e.prepare(mode, prod, cons)
					e.c.Data.SetDelay(3 * time.Second) // past the shutdown's drain
					p = e.submitLoad(cons, req, keys)
					e.eventually(func() bool { return prod.Wire.Seen(In, protocol.TypeFetch) > 1 }, loadBound,
						says("the fetch never reached the producer"))
					e.idle(20 * time.Millisecond)
				}
				e.shutdown(prod)
				if busy {
					p = e.settle(cons, p, e.wait(p.job, time.Second))
					require.False(t, p.ok, "its producer left: the load fails at once")
					require.NoError(t, cons.FinishRequest(req))
				}
				e.eventually(func() bool { return cons.Stats().Sessions == 0 }, time.Second, says("the session survived"))

				e.c.Data.SetDelay(0)
				prod = e.open(prodPort)
				// The old incarnation's goodbye and connection-lost events may
				// still be on their way; a request racing them fails once and
				// recomputes (nothing on the wire names a session), so let
				// them land first, as the other recovery checks do.
				e.idle(100 * time.Millisecond)
				for range 2 {
					p := e.run(mode, prod, cons)
					require.True(t, p.ok, "the restarted producer serves: %+v", p)
				}
				require.EqualValues(t, 2, cons.Stats().SessionsOpened, "one session per incarnation")
				e.finish()
			})
		}
	}
}

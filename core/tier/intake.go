package tier

import (
	"errors"

	"github.com/peerkv/peerkv/core/control"
	"github.com/peerkv/peerkv/core/protocol"
	"github.com/peerkv/peerkv/core/session"
)

// Inbound frames are taken in three steps, so that the lock host calls
// wait on is never held for work that grows with a frame (docs/security.md,
// G16):
//
//  1. off the lock, the frame's type is peeked (protocol.PeekType: a few
//     bytes, whatever the frame's size);
//  2. under the lock, screen checks the sender's standing from the type
//     alone (a map look-up): a frame from an identity without a session,
//     other than a connect, or one its session may not send yet (a lookup
//     before the handshake finished), is dropped or refused there,
//     undecoded;
//  3. only a frame the sender may send is decoded, and what grows with
//     its size prepared (session.Prepare), off the lock; it is then
//     handled under it (onFrame), which checks everything again: the
//     sessions may have changed in between. A session's large frame, and
//     any of its frames behind one, is decoded by the lanes' worker
//     instead (lanes.go), so it holds up no other session's frames.
//
// Frames of one transport arrive on one goroutine, in order, so no two of
// them interleave.

// intake owns what is handed to the coordinator to apply under its lock,
// each item taken once, in the order it came, or dropped whole when the
// tier stops: the sessions' reports (settle applies them), the lanes'
// frames waiting to be decoded (lanes.go), and what goroutines found off
// the lock (registrations, diagnoses, resolved names), which the progress
// loop applies. Every queue is bounded: the reports by the calls into
// sessions that made them (settle drains them after each), the lanes in
// bytes, the loop's channels in items.
type intake struct {
	reports    []session.Report
	lanes      lanes
	registered chan registration // the registry's data-path registrations
	found      chan func()       // diagnoses, resolved names (toLoop)
}

// registration is the outcome of registering s's peer with the data path.
type registration struct {
	s   *session.Session
	err error
}

func newIntake(maxFrameBytes int) intake {
	return intake{
		lanes:      newLanes(maxFrameBytes),
		registered: make(chan registration, 64),
		found:      make(chan func(), maxDiagnoses),
	}
}

// report queues a session's report (session.Env.Report); t.mu held.
func (in *intake) report(r session.Report) { in.reports = append(in.reports, r) }

// nextReport takes the oldest report not applied yet; false when none is
// left (what held them is let go).
func (in *intake) nextReport() (session.Report, bool) {
	if len(in.reports) == 0 {
		in.reports = nil
		return session.Report{}, false
	}
	r := in.reports[0]
	in.reports[0] = session.Report{}
	in.reports = in.reports[1:]
	return r, true
}

// hasReports says whether reports wait to be applied.
func (in *intake) hasReports() bool { return len(in.reports) > 0 }

// dropReports forgets every report not applied yet (the tier was
// poisoned: they come from sessions in an unknown state).
func (in *intake) dropReports() { in.reports = nil }

// toLoop hands f to the progress loop, to run under the tier's lock; it is
// dropped once stop is closed.
func (in *intake) toLoop(f func(), stop <-chan struct{}) {
	select {
	case in.found <- f:
	case <-stop:
	}
}

// take handles one control event, on the goroutine that delivers it.
func (t *Tier) take(ev control.Event) {
	if ev.Kind != control.EventFrame {
		if t.peers.known.has(ev.PeerID) { // a stranger's lost connection ends nothing
			t.locked(func() { t.onPeerDown(ev) })
		}
		return
	}
	lim := t.frameLimits()
	typ, peekErr := protocol.PeekType(ev.Frame, lim)
	if (peekErr != nil || typ != protocol.TypeConnect) && !t.peers.known.has(ev.PeerID) {
		// Off the lock: a stranger's flood never holds up a host call.
		// screen drops it the same way should a session end meanwhile.
		t.strangerFrames.Add(1)
		t.logSessionless(ev.PeerID, describeType(typ, peekErr))
		return
	}
	decode, laned := false, false
	t.locked(func() {
		if decode = t.screen(ev, typ, peekErr); decode {
			laned = t.toLane(ev) // a session's large frame, or one behind it (lanes.go)
		}
	})
	if !decode || laned {
		return
	}
	m, err := protocol.Decode(ev.Frame, lim)
	if err == nil {
		m = session.Prepare(m, t.cfg.MaxKeysPerPeer) // a lookup's keys de-duplicated, or its refusal encoded
	}
	t.locked(func() {
		t.stats.framesDecoded++
		t.onFrame(ev, m, err)
	})
}

func (t *Tier) frameLimits() protocol.Limits {
	return protocol.Limits{MaxFrameBytes: t.cfg.MaxFrameBytes, MaxListItems: t.cfg.MaxListItems, KeyLen: t.cfg.KeyLen}
}

func (t *Tier) onPeerDown(ev control.Event) {
	if ev.Kind != control.EventPeerDown {
		return
	}
	s := t.peers.session(ev.PeerID)
	if s == nil {
		return
	}
	var ce *control.ConnectError
	if s.Unheard() && errors.As(ev.Err, &ce) {
		s.Close(ev.Err.Error(), session.Unreached(ce.Cause, ce.Unsure)) // a connection that never existed was not lost
		return
	}
	s.Close(ev.Err.Error(), session.Dropped) // "peer connection lost (EVENT_DISCONNECTED)"
}

// screen decides from a frame's type alone whether its sender may send it
// now; a frame it may not is dropped or refused here. It reports whether
// the frame must be decoded. Called with t.mu held; costs no more than a
// map look-up whatever the frame holds.
func (t *Tier) screen(ev control.Event, typ protocol.Type, peekErr error) bool {
	t.stats.framesIn++
	s := t.peers.session(ev.PeerID)
	if s == nil {
		if peekErr != nil || typ != protocol.TypeConnect {
			t.dropSessionless(ev.PeerID, describeType(typ, peekErr))
			return false
		}
		return true // a connect: onFrame admits it or not
	}
	if !t.fromSource(s, ev) {
		return false
	}
	if peekErr != nil {
		// Decode says what is wrong with it, or that it is of a type we do
		// not know (ignored, as vLLM does): the peer holds a session.
		return true
	}
	return !s.RefuseType(typ)
}

// dropSessionless drops a frame from an identity with no session.
func (t *Tier) dropSessionless(peerID, what string) {
	t.stats.droppedFrames++
	t.logSessionless(peerID, what)
}

// logSessionless logs a dropped frame of a sender with no session (the
// log's limiter keeps it to a few lines a second).
func (t *Tier) logSessionless(peerID, what string) {
	t.logf("WARNING", "dropping a frame from %s, which has no session (first message must be connect): %v", peerID, what)
}

// fromSource pins s to the address its first frame comes from, and drops
// (false) a frame under its id from any other.
func (t *Tier) fromSource(s *session.Session, ev control.Event) bool {
	if ev.Addr == "" {
		return true
	}
	s.PinSource(ev.Addr)
	if s.Source() == ev.Addr {
		return true
	}
	// Someone else connected under this peer's id: its frames are not the
	// session's.
	t.stats.droppedFrames++
	t.logf("WARNING", "dropping a frame claiming to be %s from %s: the session's frames come from %s",
		ev.PeerID, ev.Addr, s.Source())
	return false
}

func describeType(typ protocol.Type, err error) string {
	if err != nil {
		return err.Error()
	}
	return string(typ)
}

package tier

import (
	"fmt"

	"github.com/peerkv/peerkv/core/control"
	"github.com/peerkv/peerkv/core/protocol"
	"github.com/peerkv/peerkv/core/session"
)

// Intake lanes keep one session's large frames from holding up everyone
// else's (docs/security.md, G15, G16). Frames arrive on the transport's
// goroutine, which reads every connection in turn; a lookup of 65 536 keys
// takes that goroutine 0.1-1 s to decode and prepare (under the race
// detector), so a few sessions sending them back to back kept a newcomer's
// connect and lookups waiting past their deadlines, and what strangers sent
// piled up in the transport meanwhile. Instead, a session's frame of at
// least laneFrameBytes, and every frame of that session after it while any
// waits, goes to the session's lane; one worker decodes and handles the
// lanes' frames, one frame per lane in turn, so a session's frames keep
// their order and one session's flood delays another's large frame by at
// most one frame. Small frames of sessions with nothing waiting are handled
// at once, as before.
//
// What waits is bounded in bytes: a session whose frames would hold more
// than laneSessionBytes ends (its peer sends faster than we decode; its jobs
// are reported once), and when all lanes together would hold more than
// laneTotalBytes, the session holding the most ends first. A real peer
// sends a lookup per request it schedules; even its largest (max_list_items
// keys) fits twice.

const laneFrameBytes = 256 << 10 // a lookup of about 6 700 keys (a 100K-token prompt)

// laneSessionBytes bounds what one session's frames hold in its lane (the
// one being decoded included): room for a burst of a real peer's long
// prompts (30 lookups of 100K tokens, or 3 of max_list_items keys).
func (l *lanes) laneSessionBytes() int { return max(laneSessionFloor, 2*l.maxFrameBytes) }

// laneTotalBytes bounds what all lanes hold.
func (l *lanes) laneTotalBytes() int { return max(laneTotalFloor, 4*l.maxFrameBytes) }

const (
	laneSessionFloor = 8 << 20
	laneTotalFloor   = 16 << 20
)

// laneCost is what a frame counts for in a lane: its bytes and a fixed cost,
// so that many small frames count too.
func laneCost(frame []byte) int { return len(frame) + 64 }

// lanes is the intake's; owned under t.mu but for wake and done. Its
// invariant: bytes is what every lane holds (waiting and in flight).
type lanes struct {
	byPeer        map[string]*lane
	turn          []*lane // lanes with frames waiting, next first
	bytes         int     // held by every lane, frames being decoded included
	maxFrameBytes int     // the bounds are multiples of it
	wake          chan struct{}
	done          chan struct{}
}

func newLanes(maxFrameBytes int) lanes {
	return lanes{byPeer: map[string]*lane{}, maxFrameBytes: maxFrameBytes,
		wake: make(chan struct{}, 1), done: make(chan struct{})}
}

// lane is one session's frames waiting to be decoded.
type lane struct {
	s        *session.Session
	frames   []control.Event
	waiting  int  // bytes of frames
	inflight int  // bytes of the frame the worker decodes now
	queued   bool // in turn
	dropped  bool // its session ended: what the worker holds of it is not handled
}

func (ln *lane) bytes() int { return ln.waiting + ln.inflight }

// queue puts ev, a frame of s, in s's lane when it must wait there (see
// the top of this file), and reports whether it took ev (queued, or
// dropped with its session). A session whose frames would pass a bound is
// handed to end, which must end it (and drop its lane: dropSession).
// Called with t.mu held, after screen let ev through.
func (l *lanes) queue(ev control.Event, s *session.Session, end func(s *session.Session, why string)) bool {
	ln := l.byPeer[ev.PeerID]
	if ln != nil && ln.s != s {
		l.drop(ln) // an ended session's
		ln = nil
	}
	if ln == nil && len(ev.Frame) < laneFrameBytes {
		return false
	}
	cost := laneCost(ev.Frame)
	held := 0
	if ln != nil {
		held = ln.bytes()
	}
	if held+cost > l.laneSessionBytes() {
		end(s, fmt.Sprintf("its frames arrive faster than they are decoded: %d bytes of them wait and "+
			"this one is %d more, bound %d (8 MiB or 2 x max_frame_bytes)", held, cost, l.laneSessionBytes()))
		return true
	}
	for l.bytes+cost > l.laneTotalBytes() {
		hog := l.hog()
		if hog == nil {
			break
		}
		end(hog.s, fmt.Sprintf("the frames of every session waiting to be decoded hold %d bytes, bound %d, "+
			"and this session's hold the most (%d)", l.bytes, l.laneTotalBytes(), hog.bytes()))
		if hog.s == s {
			return true
		}
	}
	if ln == nil {
		ln = &lane{s: s}
		l.byPeer[ev.PeerID] = ln
	}
	ln.frames = append(ln.frames, ev)
	ln.waiting += cost
	l.bytes += cost
	if !ln.queued {
		ln.queued = true
		l.turn = append(l.turn, ln)
	}
	select {
	case l.wake <- struct{}{}:
	default:
	}
	return true
}

// hog is the lane holding the most bytes; nil if none holds any.
func (l *lanes) hog() *lane {
	var hog *lane
	for _, ln := range l.byPeer {
		if ln.bytes() > 0 && (hog == nil || ln.bytes() > hog.bytes()) {
			hog = ln
		}
	}
	return hog
}

// dropSession forgets the lane of s, which ended, if it has one.
func (l *lanes) dropSession(s *session.Session) {
	if ln := l.byPeer[s.PeerID()]; ln != nil && ln.s == s {
		l.drop(ln)
	}
}

// drop forgets ln's waiting frames; the one the worker decodes, if any, is
// accounted for when it is done (decoded).
func (l *lanes) drop(ln *lane) {
	ln.dropped = true
	l.bytes -= ln.waiting
	ln.waiting, ln.frames = 0, nil
	if l.byPeer[ln.s.PeerID()] == ln {
		delete(l.byPeer, ln.s.PeerID())
	}
	if ln.queued {
		ln.queued = false
		for i, q := range l.turn {
			if q == ln {
				l.turn = append(l.turn[:i], l.turn[i+1:]...)
				break
			}
		}
	}
}

// next takes the oldest frame of the lane whose turn it is, for the worker
// to decode off the lock; false when no frame waits. The lane's next frame
// waits for every other lane's.
func (l *lanes) next() (*lane, control.Event, bool) {
	if len(l.turn) == 0 {
		return nil, control.Event{}, false
	}
	ln := l.turn[0]
	l.turn = l.turn[1:]
	ev := ln.frames[0]
	ln.frames[0] = control.Event{}
	ln.frames = ln.frames[1:]
	cost := laneCost(ev.Frame)
	ln.waiting -= cost
	ln.inflight = cost
	if len(ln.frames) > 0 {
		l.turn = append(l.turn, ln)
	} else {
		ln.queued = false
	}
	return ln, ev, true
}

// decoded accounts for the frame of ln the worker decoded, and reports
// whether it is still to be handled: not when ln was dropped meanwhile.
func (l *lanes) decoded(ln *lane) bool {
	l.bytes -= ln.inflight
	ln.inflight = 0
	return !ln.dropped
}

// handled forgets ln once nothing of it waits: its session's next frame
// is handled at once.
func (l *lanes) handled(ln *lane) {
	if !ln.dropped && len(ln.frames) == 0 && ln.inflight == 0 && l.byPeer[ln.s.PeerID()] == ln {
		delete(l.byPeer, ln.s.PeerID())
	}
}

// toLane has the intake's lanes take ev when it must wait there, and
// reports whether they took it. Called with t.mu held, after screen.
func (t *Tier) toLane(ev control.Event) bool {
	s := t.peers.session(ev.PeerID)
	if s == nil {
		return false // a connect: handled at once
	}
	return t.intake.lanes.queue(ev, s, t.endForLane)
}

// endForLane ends s for what it made its lane hold.
func (t *Tier) endForLane(s *session.Session, why string) {
	t.stats.droppedFrames++
	t.logf("WARNING", "ending the session with %s: %s", s.PeerID(), why)
	s.Close(why, session.Dropped)
	t.intake.lanes.dropSession(s)
}

// runLanes decodes and handles the lanes' frames until the tier stops.
func (t *Tier) runLanes() {
	defer close(t.intake.lanes.done)
	defer t.recoverLoop("the intake lanes")
	for {
		select {
		case <-t.life.stop:
			return
		case <-t.intake.lanes.wake:
		}
		for t.takeFromLane() {
		}
	}
}

// takeFromLane decodes the next lane's oldest frame off the lock and
// handles it under it; false when no frame waits.
func (t *Tier) takeFromLane() bool {
	t.mu.Lock()
	if t.life.closed {
		t.mu.Unlock()
		return false
	}
	ln, ev, ok := t.intake.lanes.next()
	t.unlockHost() // tells what a host call missed meanwhile, as every holder does
	if !ok {
		return false
	}
	m, err := protocol.Decode(ev.Frame, t.frameLimits())
	if err == nil {
		m = session.Prepare(m, t.cfg.MaxKeysPerPeer)
	}
	t.locked(func() {
		if !t.intake.lanes.decoded(ln) || t.peers.session(ev.PeerID) != ln.s {
			return // its session ended meanwhile
		}
		t.stats.framesDecoded++
		t.onFrame(ev, m, err)
		t.intake.lanes.handled(ln)
	})
	return true
}

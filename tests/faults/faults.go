// Package faults is peerkv's fault-injection suite. This file is Wire, a
// control.Transport wrapper that drops, duplicates, reorders, delays or
// holds frames by direction and message type; the other non-test files are
// the host-side bookkeeping (ledger, row patterns, peers) that the tests
// here and tests/soak share.
package faults

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/peerkv/peerkv/core/control"
	"github.com/peerkv/peerkv/core/control/eventq"
	"github.com/peerkv/peerkv/core/protocol"
)

// Dir says which frames of the wrapped peer a rule sees.
type Dir uint8

const (
	Out Dir = 1 << iota // frames the peer sends
	In                  // frames the peer receives
)

// Action is what happens to a frame a rule matches.
type Action uint8

const (
	Pass Action = iota
	Drop
	Duplicate
	// Reorder holds the frame until the next frame of the same direction
	// and peer has gone, then releases it (or after Rule.Delay, default
	// DefaultReorderMax, when no next frame comes).
	Reorder
	Delay // release the frame Rule.Delay later
	Hold  // keep the frame until Release
)

func (a Action) String() string {
	return [...]string{"pass", "drop", "duplicate", "reorder", "delay", "hold"}[a]
}

// DefaultReorderMax bounds how long Reorder holds a frame no other follows.
const DefaultReorderMax = 500 * time.Millisecond

// Rule selects frames and says what to do with them.
type Rule struct {
	Dir    Dir
	Types  []protocol.Type // empty: every type
	Action Action
	Times  int           // frames it applies to before it is spent (0: no limit)
	Prob   float64       // chance per matching frame (0: always)
	Delay  time.Duration // Delay: how late; Reorder: the longest hold
}

type rule struct {
	Rule
	used int
}

// frame is one frame in either direction; ev.PeerID is the destination
// (Out) or the sender (In).
type frame struct {
	dir Dir
	ev  control.Event
}

type swapKey struct {
	dir  Dir
	peer string
}

// Wire wraps one peer's control transport. Frames are matched by their
// decoded "type"; events other than frames always pass.
type Wire struct {
	inner  control.Transport
	events chan control.Event
	inq    *eventq.Queue
	stop   chan struct{}
	wg     sync.WaitGroup
	once   sync.Once

	mu      sync.Mutex
	closed  bool
	rng     *rand.Rand
	rules   []*rule
	held    []frame
	swapped map[swapKey]*frame
	timers  map[*time.Timer]struct{}
	pending int // frames delayed, held or swapped
	applied map[Action]int
	seen    map[Dir]map[protocol.Type]int
}

var _ control.Transport = (*Wire)(nil)

// Wrap starts a Wire over inner; seed drives Rule.Prob.
func Wrap(inner control.Transport, seed uint64) *Wire {
	w := &Wire{
		inner:   inner,
		events:  make(chan control.Event),
		inq:     eventq.New(),
		stop:    make(chan struct{}),
		rng:     rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		swapped: map[swapKey]*frame{},
		timers:  map[*time.Timer]struct{}{},
		applied: map[Action]int{},
		seen:    map[Dir]map[protocol.Type]int{Out: {}, In: {}},
	}
	w.wg.Add(2)
	go w.read()
	go w.deliver()
	return w
}

// Set replaces the rules; frames already held, delayed or swapped stay so.
func (w *Wire) Set(rules ...Rule) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.rules = w.rules[:0]
	for _, r := range rules {
		w.rules = append(w.rules, &rule{Rule: r})
	}
}

// Clear removes every rule.
func (w *Wire) Clear() { w.Set() }

// Pause holds every frame in dirs, as a stopped process would.
func (w *Wire) Pause(dirs Dir) { w.Set(Rule{Dir: dirs, Action: Hold}) }

// Release clears the rules and lets the held frames go, in order.
func (w *Wire) Release() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.rules = nil
	held := w.held
	w.held = nil
	w.pending -= len(held)
	for _, f := range held {
		w.emit(f)
	}
}

// Pending is how many frames are delayed, held or swapped right now.
func (w *Wire) Pending() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pending
}

// Applied is how many frames got action a so far.
func (w *Wire) Applied(a Action) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.applied[a]
}

// Seen is how many frames of type t went in direction d (before faults).
func (w *Wire) Seen(d Dir, t protocol.Type) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.seen[d][t]
}

// LocalID implements control.Transport.
func (w *Wire) LocalID() string { return w.inner.LocalID() }

// Connect implements control.Transport.
func (w *Wire) Connect(peerID string) error { return w.inner.Connect(peerID) }

// Disconnect implements control.Transport.
func (w *Wire) Disconnect(peerID string) { w.inner.Disconnect(peerID) }

// Events implements control.Transport.
func (w *Wire) Events() <-chan control.Event { return w.events }

// Send implements control.Transport.
func (w *Wire) Send(peerID string, data []byte) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return control.ErrClosed
	}
	f := frame{dir: Out, ev: control.Event{Kind: control.EventFrame, PeerID: peerID, Frame: bytes.Clone(data)}}
	return w.handle(f)
}

// Close implements control.Transport.
func (w *Wire) Close() error {
	var err error
	w.once.Do(func() {
		w.mu.Lock()
		w.closed = true
		for t := range w.timers {
			t.Stop()
		}
		clear(w.timers)
		w.held, w.pending = nil, 0
		clear(w.swapped)
		w.mu.Unlock()
		close(w.stop)
		err = w.inner.Close()
		w.inq.Close()
		w.wg.Wait()
	})
	return err
}

// read applies the rules to inbound frames.
func (w *Wire) read() {
	defer w.wg.Done()
	defer w.inq.Close() // the inner transport ended (Close or a kill)
	for ev := range w.inner.Events() {
		w.mu.Lock()
		if ev.Kind == control.EventFrame {
			_ = w.handle(frame{dir: In, ev: ev})
		} else {
			w.inq.Push(ev)
		}
		w.mu.Unlock()
	}
}

func (w *Wire) deliver() {
	defer w.wg.Done()
	defer close(w.events)
	for {
		ev, ok := w.inq.Pop()
		if !ok {
			return
		}
		select {
		case w.events <- ev:
		case <-w.stop:
			return
		}
	}
}

// handle decides a frame's fate; called with w.mu held.
func (w *Wire) handle(f frame) error {
	typ := msgType(f.ev.Frame)
	w.seen[f.dir][typ]++
	r := w.match(f.dir, typ)
	act := Pass
	if r != nil {
		act = r.Action
		w.applied[act]++
	}
	k := swapKey{f.dir, f.ev.PeerID}
	var err error
	switch act {
	case Drop:
	case Duplicate:
		err = w.emit(f)
		w.emit(f)
	case Hold:
		w.held = append(w.held, f)
		w.pending++
		return nil
	case Delay:
		w.later(r.Delay, f, nil)
		return nil
	case Reorder:
		if w.swapped[k] == nil {
			held := f
			w.swapped[k] = &held
			limit := r.Delay
			if limit <= 0 {
				limit = DefaultReorderMax
			}
			w.later(limit, f, &held)
			return nil
		}
		w.applied[act]-- // one frame is swapped per link at a time: this one passes
		err = w.emit(f)
	default:
		err = w.emit(f)
	}
	// The frame that came next has gone: the one swapped before it follows.
	if held := w.swapped[k]; held != nil {
		delete(w.swapped, k)
		w.pending--
		w.emit(*held)
	}
	return err
}

// later emits f after d. A swapped frame (swap set) goes only if no later
// frame released it first.
func (w *Wire) later(d time.Duration, f frame, swap *frame) {
	w.pending++
	var t *time.Timer
	t = time.AfterFunc(d, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		if w.closed {
			return
		}
		delete(w.timers, t)
		if swap != nil {
			k := swapKey{f.dir, f.ev.PeerID}
			if w.swapped[k] != swap {
				return // released by the frame that followed it
			}
			delete(w.swapped, k)
		}
		w.pending--
		w.emit(f)
	})
	w.timers[t] = struct{}{}
}

// emit sends or delivers f; called with w.mu held, which keeps frames that
// pass in the order they were decided.
func (w *Wire) emit(f frame) error {
	if f.dir == Out {
		return w.inner.Send(f.ev.PeerID, f.ev.Frame)
	}
	w.inq.Push(f.ev)
	return nil
}

func (w *Wire) match(d Dir, typ protocol.Type) *rule {
	for _, r := range w.rules {
		if r.Dir&d == 0 || (r.Times > 0 && r.used >= r.Times) {
			continue
		}
		if len(r.Types) > 0 && !slices.Contains(r.Types, typ) {
			continue
		}
		if r.Prob > 0 && w.rng.Float64() >= r.Prob {
			continue
		}
		r.used++
		return r
	}
	return nil
}

// msgType is the frame's "type", or "" when it does not decode.
func msgType(b []byte) protocol.Type {
	m, err := protocol.Decode(b, protocol.Limits{})
	if err != nil {
		return ""
	}
	return m.MsgType()
}

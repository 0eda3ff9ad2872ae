// Package session is one bidirectional session with one remote peer. A
// Session (this file) coordinates: its handshake (handshake.go: states,
// auth, refusal policy, send gating), its one ending record (ending.go:
// the one place a session ends, and Close, the one way to end it from
// outside), the consumer role (consumer.go) that pulls rows from the peer,
// and the producer role (producer.go, inbound.go, round.go) that serves
// rows to it. The roles are built with the functions they need (link) and
// never hold their Session.
//
// A Session is not safe for concurrent use: its owner (core/tier) calls it
// with its own lock held. Sessions never block and never touch sockets
// directly; they send through Env.Send and hand what happened to their
// owner as Reports (report.go), which the owner applies after the call.
package session

import (
	"errors"
	"fmt"
	"time"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/data/rowsum"
	"github.com/peerkv/peerkv/core/protocol"
)

// Env is what a session needs from its owner.
type Env struct {
	LocalID string
	// Epoch names this start of the node (random, never 0): it goes out in
	// every connect, so a peer tells our restart from a duplicate connect.
	Epoch  uint64
	Cfg    config.Config
	Region data.Region
	Data   data.Transport
	// Rows, when set, starts the data path's writes (summed ones for
	// verified pulls) and delivers their completions; without it writes
	// go to Data and are summed on the caller's thread (tests).
	Rows *rowsum.Writer
	Now  func() time.Time
	// Send encodes and queues one message to peerID.
	Send func(peerID string, m protocol.Message) error
	// Report queues one Report for the owner to apply after the call.
	Report func(Report)
	// Logf logs one line at level "DEBUG", "INFO", "WARNING" or "ERROR".
	Logf func(level, format string, args ...any)
	// LookupAnswered, when set, is told each lookup's round trip: from the
	// lookup sent to the peer's first answer to it.
	LookupAnswered func(s *Session, rtt time.Duration)
	// LookupServed, when set, is told how long each of the peer's lookups
	// was held here: from its arrival to its one answer sent.
	LookupServed func(held time.Duration)
	// NextLookupID returns a fresh inbound lookup id (unique per owner).
	NextLookupID func() int64
	// Register starts data-path registration of the peer in the background
	// and later calls RegistrationDone on the owner's goroutine.
	Register func(s *Session, info data.PeerInfo)
	// Busy, when set, is told when the session takes on a request (its
	// own or the peer's), so an owner can tick only sessions not Quiet.
	Busy func(s *Session)
	// Keys, when set, is what all the owner's sessions hold together,
	// bounded as KeyBudget says.
	Keys *KeyBudget
}

// Session is one peer's session: a coordinator of its handshake, its end
// and its two roles, which it builds with what they need and never hands
// itself to.
type Session struct {
	env    *Env
	peerID string
	// dialed: we opened the connection, so we speak first. A session the
	// peer opened sends its connect only once the peer's passed our checks,
	// so a stranger learns nothing of our region before that.
	dialed       bool
	source       string
	openedAt     time.Time
	lastActivity time.Time
	grants       data.Grants // what our data paths granted this peer, revoked at Release

	hs       handshake
	ended    ending
	consumer consumer
	producer producer
}

// New opens a session. dialed says we initiated it: then our connect goes
// out at once, otherwise it waits for the peer's. source is the address the
// peer's connection came from as the kernel reports it ("" if unknown).
func New(env *Env, peerID, source string, dialed bool) *Session {
	return open(env, peerID, source, dialed, false)
}

// NewProbe dials peerID for a handshake-only probe (`peerkv doctor`): its
// connect says so (protocol.Capabilities.Probe), so a peerkv peer tells it
// its block_len instead of refusing it unnamed.
func NewProbe(env *Env, peerID string) *Session {
	return open(env, peerID, "", true, true)
}

func open(env *Env, peerID, source string, dialed, probing bool) *Session {
	now := env.Now()
	s := &Session{env: env, peerID: peerID, source: source, dialed: dialed, openedAt: now, lastActivity: now,
		hs: newHandshake(env.Cfg.AuthSecret != "", probing)}
	l := s.link()
	s.consumer = newConsumer(l)
	s.producer = newProducer(l)
	if dialed {
		s.sendConnect()
	}
	return s
}

// link is what a role needs from its session, as values and functions: a
// role never holds its Session. env gives it configuration, clock, log and
// data paths; it sends and reports only through send and report.
type link struct {
	peerID   string
	env      *Env
	send     func(protocol.Message)      // to the peer, queued until the handshake is over
	unsend   func(protocol.Message) bool // take back a message still queued (true: never sent)
	report   func(Report)                // to the owner
	engaged  func()                      // the role took on a request
	fail     func(reason string)         // end the session as a failure
	ended    func() bool                 // the session ended
	verifies func() bool                 // the session's pulls are verified
	peerRows func() uint64               // rows the peer's region has
	answered func(rtt time.Duration)     // a lookup's first answer came (nil: nobody asks)
}

func (s *Session) link() link {
	l := link{
		peerID:   s.peerID,
		env:      s.env,
		send:     s.send,
		unsend:   s.hs.unqueue,
		report:   s.report,
		engaged:  s.busy,
		fail:     func(reason string) { s.end(ending{how: Failure, reason: reason}) },
		ended:    func() bool { return s.ended.dead },
		verifies: s.Verifies,
		peerRows: func() uint64 { return s.hs.peerRows },
	}
	if f := s.env.LookupAnswered; f != nil {
		l.answered = func(rtt time.Duration) { f(s, rtt) }
	}
	return l
}

// PeerID is the remote peer's identity.
func (s *Session) PeerID() string { return s.peerID }

// Source is the address the peer's frames come from, as the kernel reports
// it ("" until the first frame of a session we dialed).
func (s *Session) Source() string { return s.source }

// PinSource records where the peer's frames come from, once.
func (s *Session) PinSource(addr string) {
	if s.source == "" {
		s.source = addr
	}
}

// Ready reports whether the handshake is over: the peer acked our connect
// and we acked its (we may send freely).
func (s *Session) Ready() bool { return s.hs.over() && !s.ended.dead }

// LastActivity is when the peer last sent us something or we sent it work.
func (s *Session) LastActivity() time.Time { return s.lastActivity }

// Probe reports whether the session is a handshake-only probe, ours or
// the peer's: its failure counts as no rejection (and a peer's probe is
// logged at INFO).
func (s *Session) Probe() bool { return s.hs.probing || s.hs.probed }

// failLevel is the level of a line saying why the handshake failed: a
// probe's failure is the answer it asked for, not an engine's problem.
func (s *Session) failLevel() string {
	if s.hs.probed {
		return "INFO"
	}
	return "ERROR"
}

// describe names the peer in log lines: a probe says it is one.
func (s *Session) describe() string {
	if s.hs.probed {
		return "probe " + s.peerID + " (peerkv doctor)"
	}
	return "peer " + s.peerID
}

// Dialed reports whether we opened the session (a peer we pull from).
func (s *Session) Dialed() bool { return s.dialed }

// OpenedAt is when the session started.
func (s *Session) OpenedAt() time.Time { return s.openedAt }

// Dead reports whether the session ended; the owner then calls Release.
func (s *Session) Dead() bool { return s.ended.dead }

// DeathReason says why the session ended.
func (s *Session) DeathReason() string { return s.ended.reason }

// DeathLogged reports whether the session already logged why it ended.
func (s *Session) DeathLogged() bool { return s.ended.logged }

// Orderly reports whether the session ended as normal lifecycle.
func (s *Session) Orderly() bool { return s.ended.orderly() }

// RejectCause is why the handshake failed ("" if it did not), one of
// RejectionCauses.
func (s *Session) RejectCause() string { return s.ended.rejectCause }

// Unheard reports whether we dialed the peer and have heard nothing from it.
func (s *Session) Unheard() bool { return s.dialed && s.hs.seen == nil && !s.ended.dead }

// ConnectFailed reports whether the session ended because it never reached
// the peer, with the transport's cause ("" for a handshake that timed out
// with nothing heard) and whether that is a guess.
func (s *Session) ConnectFailed() (cause string, unsure, failed bool) {
	return s.ended.connectFailed()
}

// Causes of a failed handshake (metric label values).
const (
	CauseBlockLen      = "block_len"
	CauseFingerprint   = "fingerprint"
	CauseHashSeed      = "hash_seed"
	CauseIdentity      = "identity"
	CauseAuth          = "auth"
	CauseDataPath      = "data_path"
	CauseTimeout       = "timeout"
	CauseProtocol      = "protocol"
	CauseRefusedByPeer = "refused_by_peer"
)

// RejectionCauses lists every cause, in documentation order.
var RejectionCauses = []string{
	CauseBlockLen, CauseFingerprint, CauseHashSeed, CauseIdentity, CauseAuth, CauseDataPath,
	CauseTimeout, CauseProtocol, CauseRefusedByPeer,
}

// HasPendingWork is true while the handshake, loads, transfers or lookups
// still need progress.
func (s *Session) HasPendingWork() bool {
	return !s.hs.over() || s.consumer.busy() || s.producer.busy()
}

// Handle dispatches one decoded message from the peer.
func (s *Session) Handle(m protocol.Message) {
	if s.ended.dead {
		return
	}
	s.lastActivity = s.env.Now()
	if err := s.dispatch(m); err != nil {
		s.protocolError(err.Error())
	}
}

// HandleDecodeError handles a frame that did not decode: an unknown type is
// logged and ignored (as vLLM does); anything else is a protocol error.
func (s *Session) HandleDecodeError(err error) {
	if errors.Is(err, protocol.ErrUnknownType) {
		s.env.Logf("WARNING", "peer %s sent a message of unknown type (ignored): %v", s.peerID, err)
		return
	}
	s.protocolError(err.Error())
}

// RefuseType handles a frame known only by its type t when no message of
// that type may come now (a request before the handshake finished, or from
// a session that ended): the frame is a protocol error whatever it holds,
// so the owner need not decode it. It reports whether it handled the frame;
// false means decode it and call Handle or HandleDecodeError.
func (s *Session) RefuseType(t protocol.Type) bool {
	if s.ended.dead {
		return true // Handle would ignore it
	}
	err := s.hs.refusesType(t)
	if err == nil {
		return false
	}
	s.lastActivity = s.env.Now()
	s.protocolError(err.Error())
	return true
}

func (s *Session) dispatch(m protocol.Message) error {
	switch msg := m.(type) {
	case *protocol.Connect:
		return s.onConnect(msg)
	case *protocol.Disconnect:
		s.peerSaidGoodbye(msg)
		return nil
	}
	if err := s.hs.refusesType(m.MsgType()); err != nil {
		return err
	}
	switch msg := m.(type) {
	case *protocol.ConnectAck:
		s.onConnectAck()
		return nil
	case *protocol.Proof:
		return s.onProof(msg)
	case *protocol.Paths:
		return s.onPaths(msg)
	}
	switch msg := m.(type) {
	case *protocol.Lookup:
		return s.producer.onLookup(&PreparedLookup{Lookup: msg})
	case *PreparedLookup:
		return s.producer.onLookup(msg)
	case *protocol.LookupResp:
		s.consumer.onLookupResp(msg)
	case *protocol.Fetch:
		return s.producer.onFetch(msg)
	case *protocol.TransferDone:
		s.consumer.onTransferDone(msg)
	case *protocol.AbortFetch:
		s.producer.onAbortFetch(msg)
	case *protocol.AbortAck:
		s.consumer.onAbortAck(msg)
	default:
		return fmt.Errorf("unexpected %s", m.MsgType())
	}
	return nil
}

// send queues m until the peer acked our connect, then sends in order.
func (s *Session) send(m protocol.Message) {
	if s.ended.dead {
		return
	}
	if !s.Ready() {
		s.hs.queue(m)
		return
	}
	s.lastActivity = s.env.Now()
	s.sendNow(m)
}

func (s *Session) sendNow(m protocol.Message) {
	if err := s.env.Send(s.peerID, m); err != nil {
		s.end(ending{how: Dropped, reason: fmt.Sprintf("send of %s failed: %v", m.MsgType(), err)})
	}
}

// Tick applies every deadline of the session.
func (s *Session) Tick(now time.Time) {
	if s.ended.dead {
		return
	}
	if !s.hs.over() && now.Sub(s.openedAt) > s.env.Cfg.HandshakeTimeout {
		why := s.hs.stalled()
		// Nothing ever came from the peer: the owner names why (it may not
		// be reachable at all), once per peer and episode.
		unheard := s.Unheard()
		if !unheard {
			s.env.Logf(s.failLevel(), "%s: handshake timed out after %v: %s", s.describe(), s.env.Cfg.HandshakeTimeout, why)
		}
		s.end(ending{how: Failure, reason: "handshake timed out: " + why, logged: true, rejectCause: CauseTimeout,
			unheard: unheard})
		return
	}
	if s.holdsNothing() {
		return
	}
	s.consumer.tick(now)
	s.producer.tick(now)
}

// Quiet reports whether Tick has nothing to do until the session takes on
// a request (Env.Busy tells when): it ended, or its handshake is over and
// it holds no request, job or transfer. Most of a mesh's sessions are quiet
// between requests.
func (s *Session) Quiet() bool { return s.ended.dead || (s.Ready() && s.holdsNothing()) }

func (s *Session) holdsNothing() bool {
	p := &s.producer
	return len(s.consumer.requests) == 0 && len(p.requests) == 0 && len(p.jobs) == 0 && len(p.transfers) == 0
}

// busy tells the owner that the session took on a request; an ended one
// (a reaped source a pull still names) has nothing to tick.
func (s *Session) busy() {
	if s.env.Busy != nil && !s.ended.dead {
		s.env.Busy(s)
	}
}

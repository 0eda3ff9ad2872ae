// Package session is one bidirectional session with one remote peer: the
// handshake and send gating (this file), the consumer role (consumer.go) that
// pulls rows from the peer, and the producer role (producer.go, inbound.go)
// that serves rows to it.
//
// A Session is not safe for concurrent use: its owner (core/tier) calls it
// with its own lock held. Sessions never block and never touch sockets
// directly; they send through Env.Send and report results through Env.Sink.
package session

import (
	"bytes"
	"errors"
	"fmt"
	"time"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/protocol"
)

// Sink receives what sessions report upward. Methods are called with the
// owner's lock held and must not call back into the reporting session's
// state in a way that re-enters the call in progress, except where noted.
type Sink interface {
	// LoadDone reports a load job's single outcome.
	LoadDone(jobID int64, ok bool, kvRequestID string, rows []uint64)
	// StoreDone reports a store (or lookup pin) job's single outcome.
	StoreDone(jobID int64, ok bool, bytes int64)
	// ConsumerFailed marks kvRequestID so its lookups answer MISS.
	ConsumerFailed(kvRequestID string)
	// FetchArrived reports a non-terminal fetch for kvRequestID, after its
	// demand is recorded; the owner binds the id and may call AddStoredBlocks
	// or FinishProducer on s.
	FetchArrived(s *Session, kvRequestID string)
	// InboundReady queues an inbound lookup for the host to evaluate.
	InboundReady(l *InboundLookup)
	// InboundFinished reports that an inbound lookup is over.
	InboundFinished(l *InboundLookup)
}

// Env is what a session needs from its owner.
type Env struct {
	LocalID string
	Cfg     config.Config
	Region  data.Region
	Data    data.Transport
	Now     func() time.Time
	// Send encodes and queues one message to peerID.
	Send func(peerID string, m protocol.Message) error
	Sink Sink
	// Logf logs one line at level "DEBUG", "INFO", "WARNING" or "ERROR".
	Logf func(level, format string, args ...any)
	// Capabilities returns the peerkv capabilities for our connect c (fresh
	// nonce, and a proof covering c), or nil to send none.
	Capabilities func(c *protocol.Connect) *protocol.Capabilities
	// Authenticate checks a peer's connect when authentication is on.
	Authenticate func(c *protocol.Connect) error
	// NextLookupID returns a fresh inbound lookup id (unique per owner).
	NextLookupID func() int64
	// Register starts data-path registration of the peer in the background
	// and later calls RegistrationDone on the owner's goroutine.
	Register func(s *Session, info data.PeerInfo)
}

type handshake int

const (
	awaitingPeerConnect handshake = iota // our connect sent; peer's not yet seen
	registering                          // peer's connect accepted; data path registering
	acked                                // we acked the peer's connect
)

// Session is one peer's session.
type Session struct {
	env    *Env
	peerID string

	state     handshake
	sendReady bool // the peer acked our connect
	queued    []protocol.Message
	openedAt  time.Time
	peer      *protocol.Connect

	dead        bool
	deathReason string

	consumer consumer
	producer producer
}

// New opens a session and sends our connect at once (both sides do).
func New(env *Env, peerID string) *Session {
	s := &Session{env: env, peerID: peerID, openedAt: env.Now()}
	s.consumer.init(s)
	s.producer.init(s)
	s.sendConnect()
	return s
}

// PeerID is the remote peer's identity.
func (s *Session) PeerID() string { return s.peerID }

// Ready reports whether the peer acked our connect (we may send freely).
func (s *Session) Ready() bool { return s.sendReady && !s.dead }

// Dead reports whether the session ended; the owner then calls Close.
func (s *Session) Dead() bool { return s.dead }

// DeathReason says why the session ended.
func (s *Session) DeathReason() string { return s.deathReason }

// HasPendingWork is true while the handshake, loads, transfers or lookups
// still need progress.
func (s *Session) HasPendingWork() bool {
	return !s.sendReady || s.state != acked || s.consumer.busy() || s.producer.busy()
}

// Handle dispatches one decoded message from the peer.
func (s *Session) Handle(m protocol.Message) {
	if s.dead {
		return
	}
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

// Kill ends the session without a goodbye, e.g. when the connection dropped.
func (s *Session) Kill(reason string) { s.markDead(reason) }

func (s *Session) dispatch(m protocol.Message) error {
	switch msg := m.(type) {
	case *protocol.Connect:
		return s.onConnect(msg)
	case *protocol.Disconnect:
		s.markDead("peer disconnected")
		return nil
	}
	if s.peer == nil {
		return fmt.Errorf("%s before connect", m.MsgType())
	}
	switch msg := m.(type) {
	case *protocol.ConnectAck:
		s.onConnectAck()
	case *protocol.Lookup:
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

func (s *Session) onConnect(c *protocol.Connect) error {
	if s.state != awaitingPeerConnect {
		return errors.New("duplicate connect")
	}
	cfg := s.env.Cfg
	reject := func(format string, args ...any) error {
		reason := fmt.Sprintf(format, args...)
		s.env.Logf("ERROR", "rejecting peer %s: %s", s.peerID, reason)
		s.disconnect("rejected peer connect: " + reason)
		return nil
	}
	if c.BlockLen != s.env.Region.RowLen {
		return reject("block_len mismatch: peer %d bytes per row, local %d (peers must run the same model, "+
			"dtype, block size and parallel layout)", c.BlockLen, s.env.Region.RowLen)
	}
	if cfg.ConfigFingerprint != "" && c.ConfigFingerprint != "" && c.ConfigFingerprint != cfg.ConfigFingerprint {
		return reject("config fingerprint mismatch: peer %q, local %q (model, dtype, block size or KV layout differ)",
			c.ConfigFingerprint, cfg.ConfigFingerprint)
	}
	if c.HashSeed != cfg.HashSeed {
		return reject("hash seed mismatch: peer %q, local %q (set the same PYTHONHASHSEED on every peer, "+
			"or leave it unset everywhere with a sha256 prefix-cache hash)", c.HashSeed, cfg.HashSeed)
	}
	if s.env.Authenticate != nil {
		if c.PeerID != s.peerID {
			return reject("its connect names %q but its connection identity is %q", c.PeerID, s.peerID)
		}
		if err := s.env.Authenticate(c); err != nil {
			return reject("authentication failed: %v", err)
		}
	}
	s.peer = c
	s.state = registering
	info := data.PeerInfo{
		AgentMetadata: bytes.Clone(c.AgentMetadata),
		BaseAddr:      c.BaseAddr,
		NumRows:       c.NumBlocks,
		RowLen:        c.BlockLen,
	}
	if c.PeerKV != nil {
		info.DataAddr = c.PeerKV.DataAddr
		info.LocalProcess = c.PeerKV.LocalProcess
	}
	s.env.Register(s, info)
	return nil
}

// RegistrationDone completes the handshake once the peer's data path is
// registered: only then may the peer send (our ack is its permission).
func (s *Session) RegistrationDone(err error) {
	if s.dead || s.state != registering {
		return
	}
	if err != nil {
		s.env.Logf("ERROR", "rejecting peer %s: data path registration failed: %v", s.peerID, err)
		s.disconnect(fmt.Sprintf("data path registration failed: %v", err))
		return
	}
	s.state = acked
	s.sendNow(&protocol.ConnectAck{PeerID: s.env.LocalID})
}

func (s *Session) onConnectAck() {
	if s.sendReady {
		return
	}
	s.sendReady = true
	queued := s.queued
	s.queued = nil
	for _, m := range queued {
		s.sendNow(m)
	}
}

func (s *Session) sendConnect() {
	c := &protocol.Connect{
		PeerID:            s.env.LocalID,
		AgentMetadata:     s.env.Data.AgentMetadata(),
		BaseAddr:          s.env.Region.BaseAddr(),
		NumBlocks:         s.env.Region.NumRows(),
		BlockLen:          s.env.Region.RowLen,
		ConfigFingerprint: s.env.Cfg.ConfigFingerprint,
		HashSeed:          s.env.Cfg.HashSeed,
	}
	if c.AgentMetadata == nil {
		c.AgentMetadata = []byte{}
	}
	if s.env.Capabilities != nil {
		c.PeerKV = s.env.Capabilities(c)
	}
	s.sendNow(c)
}

// send queues m until the peer acked our connect, then sends in order.
func (s *Session) send(m protocol.Message) {
	if s.dead {
		return
	}
	if !s.sendReady {
		s.queued = append(s.queued, m)
		return
	}
	s.sendNow(m)
}

func (s *Session) sendNow(m protocol.Message) {
	if err := s.env.Send(s.peerID, m); err != nil {
		s.markDead(fmt.Sprintf("send of %s failed: %v", m.MsgType(), err))
	}
}

// Tick applies every deadline of the session.
func (s *Session) Tick(now time.Time) {
	if s.dead {
		return
	}
	if (!s.sendReady || s.state != acked) && now.Sub(s.openedAt) > s.env.Cfg.HandshakeTimeout {
		why := "no connect from the peer"
		switch {
		case s.state == registering:
			why = "data path registration did not finish"
		case s.state == acked:
			why = "the peer never acked our connect (it rejected us: check its log for a block_len, fingerprint, hash seed or authentication mismatch)"
		}
		s.env.Logf("ERROR", "peer %s: handshake timed out after %v: %s", s.peerID, s.env.Cfg.HandshakeTimeout, why)
		s.disconnect("handshake timed out: " + why)
		return
	}
	s.consumer.tick(now)
	s.producer.tick(now)
}

func (s *Session) protocolError(reason string) {
	s.env.Logf("ERROR", "peer %s: protocol error: %s; disconnecting", s.peerID, reason)
	s.disconnect("protocol error: " + reason)
}

// disconnect tells the peer (best effort) and ends the session.
func (s *Session) disconnect(reason string) {
	if s.dead {
		return
	}
	_ = s.env.Send(s.peerID, &protocol.Disconnect{})
	s.markDead(reason)
}

func (s *Session) markDead(reason string) {
	if s.dead {
		return
	}
	s.dead = true
	s.deathReason = reason
}

// Close ends the session and reports every job it still holds as failed,
// every consumer request with work toward this peer as failed, and every
// inbound lookup as finished. Idempotent.
func (s *Session) Close(reason string) {
	if !s.dead {
		_ = s.env.Send(s.peerID, &protocol.Disconnect{})
		s.markDead(reason)
	}
	s.queued = nil
	s.consumer.close()
	s.producer.close()
}

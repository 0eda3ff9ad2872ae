// Package session is one bidirectional session with one remote peer: the
// handshake and send gating (this file), the consumer role (consumer.go) that
// pulls rows from the peer, and the producer role (producer.go, inbound.go)
// that serves rows to it.
//
// A Session is not safe for concurrent use: its owner (core/tier) calls it
// with its own lock held. Sessions never block and never touch sockets
// directly; they send through Env.Send and hand what happened to their
// owner as Reports (report.go), which the owner applies after the call.
package session

import (
	"bytes"
	"crypto/hmac"
	"errors"
	"fmt"
	"slices"
	"strings"
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

type handshake int

const (
	awaitingPeerConnect handshake = iota // the peer's connect not yet seen
	awaitingProof                        // secret set: our proof sent, the peer's not yet verified
	awaitingPaths                        // secret set: the peer proved it; its data paths not yet seen
	registering                          // the peer's data path registering
	acked                                // we acked the peer's connect
)

// Session is one peer's session.
type Session struct {
	env    *Env
	peerID string
	// dialed: we opened the connection, so we speak first. A session the
	// peer opened sends its connect only once the peer's passed our checks,
	// so a stranger learns nothing of our region before that.
	dialed bool
	source string

	state        handshake
	connectSent  bool
	sendReady    bool // the peer acked our connect
	queued       []protocol.Message
	openedAt     time.Time
	lastActivity time.Time
	peer         *protocol.Connect
	peerRows     uint64 // rows the peer says its region has (connect, or peerkv_paths with a secret)

	nonce     []byte      // our challenge to the peer (secret set)
	peerNonce []byte      // the peer's challenge to us
	grants    data.Grants // what our data paths granted this peer, revoked at Close

	dead        bool
	deathReason string
	// deathLogged: the line that said why the session ended was logged
	// where it happened (a rejection, a protocol error, a handshake
	// timeout), so the owner does not log it again.
	deathLogged bool
	// orderly: it ended as normal lifecycle (the peer said goodbye after the
	// handshake, or the owner closed it so), logged at INFO.
	orderly bool
	// rejectCause is set when the handshake failed: one of RejectionCauses.
	rejectCause string
	// unreached: we dialed and never heard from the peer (connect failed or
	// timed out); connectCause is the transport's word for why ("" unknown).
	unreached     bool
	connectCause  string
	connectUnsure bool
	refused       []string // the fields of our connect the peer refused, as it named them
	// quietRefusal: refuse a stock peer without a goodbye (see RefuseQuietly).
	quietRefusal bool
	seen         *PeerConnect // the peer's connect as it arrived, before our checks
	peerEpoch    uint64       // the epoch in the peer's connect (0: none sent)
	// probing: we opened this session as a handshake-only probe (NewProbe);
	// probed: the peer's connect marked it as one. Either way no rows move.
	probing, probed bool

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
		probing: probing}
	if env.Cfg.AuthSecret != "" {
		s.nonce = newNonce()
	}
	s.consumer.init(s)
	s.producer.init(s)
	if dialed {
		s.sendConnect()
	}
	return s
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
func (s *Session) Ready() bool { return s.sendReady && s.state == acked && !s.dead }

// LastActivity is when the peer last sent us something or we sent it work.
func (s *Session) LastActivity() time.Time { return s.lastActivity }

// Probe reports whether the session is a handshake-only probe, ours or
// the peer's: its failure counts as no rejection (and a peer's probe is
// logged at INFO).
func (s *Session) Probe() bool { return s.probing || s.probed }

// failLevel is the level of a line saying why the handshake failed: a
// probe's failure is the answer it asked for, not an engine's problem.
func (s *Session) failLevel() string {
	if s.probed {
		return "INFO"
	}
	return "ERROR"
}

// Dialed reports whether we opened the session (a peer we pull from).
func (s *Session) Dialed() bool { return s.dialed }

// OpenedAt is when the session started.
func (s *Session) OpenedAt() time.Time { return s.openedAt }

// Dead reports whether the session ended; the owner then calls Close.
func (s *Session) Dead() bool { return s.dead }

// DeathReason says why the session ended.
func (s *Session) DeathReason() string { return s.deathReason }

// DeathLogged reports whether the session already logged why it ended.
func (s *Session) DeathLogged() bool { return s.deathLogged }

// Orderly reports whether the session ended as normal lifecycle.
func (s *Session) Orderly() bool { return s.orderly }

// RejectCause is why the handshake failed ("" if it did not), one of
// RejectionCauses.
func (s *Session) RejectCause() string { return s.rejectCause }

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
	return !s.sendReady || s.state != acked || s.consumer.busy() || s.producer.busy()
}

// Handle dispatches one decoded message from the peer.
func (s *Session) Handle(m protocol.Message) {
	if s.dead {
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
	if s.dead {
		return true // Handle would ignore it
	}
	err := s.refusesType(t)
	if err == nil {
		return false
	}
	s.lastActivity = s.env.Now()
	s.protocolError(err.Error())
	return true
}

// refusesType says why no message of type t may come in the session's
// state, or nil. connect and disconnect may always come.
func (s *Session) refusesType(t protocol.Type) error {
	switch t {
	case protocol.TypeConnect, protocol.TypeDisconnect:
		return nil
	}
	if s.peer == nil {
		return fmt.Errorf("%s before connect", t)
	}
	switch t {
	case protocol.TypeConnectAck, protocol.TypeProof, protocol.TypePaths:
		return nil
	}
	// A peer may send requests only after our ack: vLLM queues them until
	// then, and so do we.
	if s.state != acked {
		return fmt.Errorf("%s before the handshake finished", t)
	}
	if s.probed {
		return fmt.Errorf("%s from a probe (a probe's session carries no requests)", t)
	}
	return nil
}

// Kill ends the session without a goodbye, e.g. when the connection dropped.
func (s *Session) Kill(reason string) { s.markDead(reason) }

// Unheard reports whether we dialed the peer and have heard nothing from it.
func (s *Session) Unheard() bool { return s.dialed && s.seen == nil && !s.dead }

// FailConnect ends a session whose connection to the peer never came up;
// cause is the transport's (control.ConnectFailureCauses), unsure when it
// is only a guess. The owner says why, once per peer and episode.
func (s *Session) FailConnect(cause string, unsure bool, reason string) {
	if s.dead {
		return
	}
	s.unreached, s.connectCause, s.connectUnsure = true, cause, unsure
	s.markDead(reason)
}

// ConnectFailed reports whether the session ended because it never reached
// the peer, with the transport's cause ("" for a handshake that timed out
// with nothing heard) and whether that is a guess.
func (s *Session) ConnectFailed() (cause string, unsure, failed bool) {
	return s.connectCause, s.connectUnsure, s.unreached
}

func (s *Session) dispatch(m protocol.Message) error {
	switch msg := m.(type) {
	case *protocol.Connect:
		return s.onConnect(msg)
	case *protocol.Disconnect:
		if s.Ready() {
			s.orderly = true
			s.markDead("it closed the session")
		} else {
			s.rejectCause = CauseRefusedByPeer
			s.refused = msg.Refused
			if len(msg.Refused) > 0 {
				s.markDead(fmt.Sprintf("it refused our connect, naming as different from its own: %s (its log has the values)",
					strings.Join(msg.Refused, ", ")))
			} else {
				s.markDead("it refused our connect (its log names why: block_len, config fingerprint, hash seed, " +
					"auth secret, or its session limits)")
			}
		}
		return nil
	}
	if err := s.refusesType(m.MsgType()); err != nil {
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

// checkFields refuses a connect whose block_len, fingerprint or hash seed
// differ from ours, naming every one that does: in the log with both
// values, and to a peerkv peer by name only (a stranger learns no value).
func (s *Session) checkFields(c *protocol.Connect) error {
	cfg := s.env.Cfg
	var causes, names, why []string
	if c.BlockLen != s.env.Region.RowLen {
		causes, names = append(causes, CauseBlockLen), append(names, "block_len")
		why = append(why, fmt.Sprintf("block_len mismatch: peer %d bytes per row, local %d (peers must run the same "+
			"model, dtype, block size and parallel layout)", c.BlockLen, s.env.Region.RowLen))
	}
	if cfg.ConfigFingerprint != "" && c.ConfigFingerprint != "" && c.ConfigFingerprint != cfg.ConfigFingerprint {
		causes, names = append(causes, CauseFingerprint), append(names, "config_fingerprint")
		why = append(why, fmt.Sprintf("config fingerprint mismatch: peer %q, local %q (model, dtype, block size or "+
			"KV layout differ)", c.ConfigFingerprint, cfg.ConfigFingerprint))
	}
	if c.HashSeed != cfg.HashSeed {
		causes, names = append(causes, CauseHashSeed), append(names, "hash_seed")
		why = append(why, fmt.Sprintf("hash seed mismatch: peer %q, local %q (set the same PYTHONHASHSEED on every "+
			"peer, or leave it unset everywhere with a sha256 prefix-cache hash)", c.HashSeed, cfg.HashSeed))
	}
	if s.probed && len(causes) == 1 && causes[0] == CauseBlockLen {
		return nil // a probe's own block_len: answered once the rest passed (refuseProbeBlockLen)
	}
	if len(causes) == 0 {
		return nil
	}
	reason := strings.Join(why, "; ")
	s.env.Logf(s.failLevel(), "rejecting %s: %s", s.describe(), reason)
	s.failHandshake(causes[0])
	if s.dead {
		return nil
	}
	goodbye := &protocol.Disconnect{}
	if c.PeerKV != nil && cfg.AuthSecret == "" {
		// With a secret, a dialer that has not proved it yet learns nothing.
		goodbye.Refused = names
	}
	if !s.refusesQuietly() {
		_ = s.env.Send(s.peerID, goodbye)
	}
	s.markDead("rejected its connect: " + reason)
	return nil
}

// refuseProbeBlockLen answers a probe that passed every other check but
// gave another block_len (it may not know ours): our connect first, which
// tells it ours, then the refusal naming block_len.
func (s *Session) refuseProbeBlockLen(c *protocol.Connect) error {
	if !s.connectSent {
		s.sendConnect()
	}
	s.env.Logf("INFO", "rejecting %s: block_len %d, local %d (our connect told it ours)", s.describe(),
		c.BlockLen, s.env.Region.RowLen)
	s.failHandshake(CauseBlockLen)
	_ = s.env.Send(s.peerID, &protocol.Disconnect{Refused: []string{"block_len"}})
	s.markDead(fmt.Sprintf("rejected its connect: block_len mismatch: probe %d bytes per row, local %d",
		c.BlockLen, s.env.Region.RowLen))
	return nil
}

// describe names the peer in log lines: a probe says it is one.
func (s *Session) describe() string {
	if s.probed {
		return "probe " + s.peerID + " (peerkv doctor)"
	}
	return "peer " + s.peerID
}

// RefuseQuietly makes a refusal of a stock vLLM peer send no goodbye, as
// vLLM's own refusals do. A stock peer opens a session, and sends its
// connect, for any frame from a peer it holds none with: the owner sets
// this on the session that goodbye of ours drew, so two ends that refuse
// each other stop after one exchange instead of trading connects and
// goodbyes for as long as both run.
func (s *Session) RefuseQuietly() { s.quietRefusal = true }

// refusesQuietly: a refusal of this peer sends no goodbye.
func (s *Session) refusesQuietly() bool {
	return s.quietRefusal && s.seen != nil && !s.seen.PeerKV
}

// refuse ends a handshake we refused: with a goodbye, unless quiet.
func (s *Session) refuse(reason string) {
	if s.refusesQuietly() {
		s.markDead(reason)
		return
	}
	s.disconnect(reason)
}

// reject refuses the peer for cause: one line logged, goodbye sent,
// session dead.
func (s *Session) reject(cause, format string, args ...any) error {
	reason := fmt.Sprintf(format, args...)
	s.env.Logf(s.failLevel(), "rejecting %s: %s", s.describe(), reason)
	s.failHandshake(cause)
	if s.probed && cause == CauseAuth && !s.dead {
		// A probe is told which check failed, never why: whoever runs it
		// acts on "auth_secret"; the values stay here.
		_ = s.env.Send(s.peerID, &protocol.Disconnect{Refused: []string{"auth_secret"}})
		s.markDead("rejected its connect: " + reason)
		return nil
	}
	s.refuse("rejected its connect: " + reason)
	return nil
}

// failHandshake records that the handshake failed for cause and that the
// reason was logged already.
func (s *Session) failHandshake(cause string) {
	if !s.dead {
		s.rejectCause = cause
		s.deathLogged = true
	}
}

// Restarted reports whether c, a connect under this session's peer id,
// comes from a new start (incarnation) of the peer rather than from the
// one this session has spoken with, and says how it tells. A peer sends
// connect only from a session it just opened, so once the session has seen
// the peer's connect another one means the peer holds no session with us:
// it restarted (its epoch differs), or it is a peer that names no epoch
// (stock vLLM, or an older peerkv), whose fresh connect is all a restart
// looks like on its wire, once our handshake with it is over. The same
// epoch again is the same incarnation sending a duplicate connect: a
// protocol error, as before (and what stops two ends from replacing each
// other's sessions back and forth).
func (s *Session) Restarted(c *protocol.Connect) (bool, string) {
	if s.dead || s.seen == nil {
		return false, "" // no connect seen yet: this one is the handshake's
	}
	var epoch uint64
	if c.PeerKV != nil {
		epoch = c.PeerKV.Epoch
	}
	switch {
	case epoch == 0 && s.peerEpoch == 0:
		// Only once the handshake is over: before, a stock peer's connect
		// is the one our own refusal drew (see RefuseQuietly), not a restart.
		if !s.Ready() {
			return false, ""
		}
		return true, "it sent a new connect (a peer without restart epochs: a new session on its side)"
	case epoch != s.peerEpoch:
		return true, fmt.Sprintf("it restarted (epoch %016x, was %016x)", epoch, s.peerEpoch)
	}
	return false, ""
}

func (s *Session) onConnect(c *protocol.Connect) error {
	if s.state != awaitingPeerConnect {
		return errors.New("duplicate connect")
	}
	s.seen = &PeerConnect{At: s.env.Now(), PeerID: c.PeerID, BlockLen: c.BlockLen, NumBlocks: c.NumBlocks,
		ConfigFingerprint: c.ConfigFingerprint, HashSeed: c.HashSeed, PeerKV: c.PeerKV != nil}
	if c.PeerKV != nil {
		s.seen.CapsVersion, s.seen.DataTransport = c.PeerKV.Version, c.PeerKV.DataTransport
		s.seen.Challenges = len(c.PeerKV.Nonce) > 0
		s.peerEpoch = c.PeerKV.Epoch
		if c.PeerKV.Probe && !s.dialed {
			s.probed = true
			s.env.Logf("INFO", "%s connected: handshake only (its outcome is logged at INFO and counted as no "+
				"rejection; it may send no requests)", s.describe())
		}
	}
	if err := s.checkFields(c); err != nil || s.dead {
		return err
	}
	cfg := s.env.Cfg
	// vLLM sends its own id as both; a mismatch is a confused or lying peer.
	if c.PeerID != s.peerID {
		return s.reject(CauseIdentity, "its connect names %q but its connection identity is %q", c.PeerID, s.peerID)
	}
	if c.PeerID == s.env.LocalID {
		return s.reject(CauseIdentity, "it claims our own id %q", c.PeerID)
	}
	if s.probed && c.BlockLen != s.env.Region.RowLen {
		return s.refuseProbeBlockLen(c)
	}
	s.peer = c
	if cfg.AuthSecret != "" {
		n, err := peerNonce(c)
		if err != nil {
			return s.reject(CauseAuth, "authentication failed: %v", err)
		}
		s.peerNonce = bytes.Clone(n)
		if !s.connectSent {
			s.sendConnect()
		}
		s.state = awaitingProof
		s.sendNow(&protocol.Proof{PeerID: s.env.LocalID,
			Proof: proof(cfg.AuthSecret, s.env.LocalID, s.peerID, s.peerNonce, s.nonce)})
		return nil
	}
	if !s.connectSent {
		s.sendConnect()
	}
	info := data.PeerInfo{
		AgentMetadata: bytes.Clone(c.AgentMetadata),
		BaseAddr:      c.BaseAddr,
		NumRows:       c.NumBlocks,
		RowLen:        c.BlockLen,
	}
	if c.PeerKV != nil {
		info.DataAddr = c.PeerKV.DataAddr
		info.SameHost = c.PeerKV.SameHost
		info.DataToken = c.PeerKV.DataToken
	}
	c.AgentMetadata = nil // handed to the data path; the session keeps no blobs
	s.register(info)
	return nil
}

// onProof checks the peer's answer to our challenge.
func (s *Session) onProof(m *protocol.Proof) error {
	if s.state != awaitingProof {
		return errors.New("unexpected peerkv_proof")
	}
	want := proof(s.env.Cfg.AuthSecret, s.peerID, s.env.LocalID, s.nonce, s.peerNonce)
	if m.PeerID != s.peerID || !hmac.Equal(m.Proof, want) {
		return s.reject(CauseAuth, "authentication failed: its proof does not match our auth secret "+
			"(a different secret on that peer, or a proof replayed or relayed from another session)")
	}
	s.state = awaitingPaths
	p := &protocol.Paths{
		AgentMetadata: s.env.Data.AgentMetadata(),
		BaseAddr:      s.env.Region.BaseAddr(),
		NumBlocks:     s.env.Region.NumRows(),
		DataTransport: s.env.Data.Name(),
		DataAddr:      s.env.Data.DataAddr(),
	}
	g := s.grant()
	p.SameHost, p.DataToken = g.SameHost, g.DataToken
	if p.AgentMetadata == nil {
		p.AgentMetadata = []byte{}
	}
	p.MAC = pathsMAC(s.env.Cfg.AuthSecret, s.env.LocalID, s.peerID, s.peerNonce, s.nonce, p)
	s.sendNow(p)
	return nil
}

// onPaths registers the data paths of a peer that proved the secret.
func (s *Session) onPaths(m *protocol.Paths) error {
	if s.state != awaitingPaths {
		return errors.New("unexpected peerkv_paths")
	}
	if !hmac.Equal(m.MAC, pathsMAC(s.env.Cfg.AuthSecret, s.peerID, s.env.LocalID, s.nonce, s.peerNonce, m)) {
		return s.reject(CauseAuth, "authentication failed: its peerkv_paths were altered or belong to another session")
	}
	s.register(data.PeerInfo{
		AgentMetadata: bytes.Clone(m.AgentMetadata),
		BaseAddr:      m.BaseAddr,
		NumRows:       m.NumBlocks,
		RowLen:        s.peer.BlockLen,
		DataAddr:      m.DataAddr,
		Grants:        data.Grants{SameHost: m.SameHost, DataToken: m.DataToken},
	})
	return nil
}

func (s *Session) register(info data.PeerInfo) {
	s.state = registering
	s.peerRows = info.NumRows
	s.env.Register(s, info)
}

// RegistrationDone completes the handshake once the peer's data path is
// registered: only then may the peer send (our ack is its permission).
func (s *Session) RegistrationDone(err error) {
	if s.dead || s.state != registering {
		return
	}
	if err != nil {
		s.env.Logf(s.failLevel(), "rejecting %s: data path registration failed: %v", s.describe(), err)
		s.failHandshake(CauseDataPath)
		s.refuse(fmt.Sprintf("data path registration failed: %v", err))
		return
	}
	s.state = acked
	s.sendNow(&protocol.ConnectAck{PeerID: s.env.LocalID})
	s.flushQueued()
}

func (s *Session) onConnectAck() {
	if s.sendReady {
		return
	}
	s.sendReady = true
	s.flushQueued()
}

// flushQueued sends what waited for the handshake once both sides acked.
func (s *Session) flushQueued() {
	if !s.Ready() {
		return
	}
	queued := s.queued
	s.queued = nil
	for _, m := range queued {
		s.sendNow(m)
	}
	// Probes registered while the handshake ran go out now, not at the
	// host's next step end (an idle host may not call in for a while).
	s.FlushLookups()
}

// sendConnect sends our connect. With a secret it carries only the
// challenge: the data-path fields follow in peerkv_paths once the peer
// proved the secret. Without one it carries what vLLM peers need.
func (s *Session) sendConnect() {
	s.connectSent = true
	c := &protocol.Connect{
		PeerID:            s.env.LocalID,
		AgentMetadata:     []byte{},
		NumBlocks:         1,
		BlockLen:          s.env.Region.RowLen,
		ConfigFingerprint: s.env.Cfg.ConfigFingerprint,
		HashSeed:          s.env.Cfg.HashSeed,
	}
	caps := &protocol.Capabilities{Version: capabilitiesVersion, Nonce: []byte{}, Epoch: s.env.Epoch, Probe: s.probing}
	if !s.env.Cfg.NoVerifyPulls {
		caps.Verify = protocol.VerifyCRC32C
	}
	if s.env.Cfg.AuthSecret != "" {
		caps.Nonce = s.nonce
	} else {
		if md := s.env.Data.AgentMetadata(); md != nil {
			c.AgentMetadata = md
		}
		c.BaseAddr = s.env.Region.BaseAddr()
		c.NumBlocks = s.env.Region.NumRows()
		caps.DataTransport = s.env.Data.Name()
		caps.DataAddr = s.env.Data.DataAddr()
		g := s.grant()
		caps.SameHost, caps.DataToken = g.SameHost, g.DataToken
	}
	c.PeerKV = caps
	s.sendNow(c)
}

// Verifies reports whether this session's pulls are verified: both sides
// offered the same row checksum in their connects.
func (s *Session) Verifies() bool {
	return !s.env.Cfg.NoVerifyPulls && s.peer != nil && s.peer.PeerKV != nil &&
		s.peer.PeerKV.Verify == protocol.VerifyCRC32C
}

// grant mints what our data paths grant this session's peer alone.
func (s *Session) grant() data.Grants {
	gr, ok := s.env.Data.(data.Granter)
	if !ok {
		return data.Grants{}
	}
	if s.grants != (data.Grants{}) {
		gr.Revoke(s.peerID, s.grants)
		s.grants = data.Grants{}
	}
	gr.Grant(s.peerID, &s.grants)
	return s.grants
}

// send queues m until the peer acked our connect, then sends in order.
func (s *Session) send(m protocol.Message) {
	if s.dead {
		return
	}
	if !s.Ready() {
		s.queued = append(s.queued, m)
		return
	}
	s.lastActivity = s.env.Now()
	s.sendNow(m)
}

// unqueue takes m back from the messages waiting for the handshake,
// reporting whether it was there (so never sent).
func (s *Session) unqueue(m protocol.Message) bool {
	if i := slices.Index(s.queued, m); i >= 0 {
		s.queued = slices.Delete(s.queued, i, i+1)
		return true
	}
	return false
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
		case s.state == awaitingProof:
			why = "the peer never proved the auth secret (a stock vLLM peer, or a peer without auth_secret)"
		case s.state == awaitingPaths:
			why = "the peer proved the secret but sent no data paths (it rejected our proof: check its log)"
		case s.state == registering:
			why = "data path registration did not finish"
		case s.state == acked:
			why = "the peer never acked our connect (it rejected us: check its log for a block_len, fingerprint, hash seed or authentication mismatch)"
		}
		if s.Unheard() {
			// Nothing ever came from the peer: the owner names why (it may
			// not be reachable at all), once per peer and episode.
			s.unreached, s.connectUnsure = true, true
		} else {
			s.env.Logf(s.failLevel(), "%s: handshake timed out after %v: %s", s.describe(), s.env.Cfg.HandshakeTimeout, why)
		}
		s.failHandshake(CauseTimeout)
		s.disconnect("handshake timed out: " + why)
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
func (s *Session) Quiet() bool { return s.dead || (s.Ready() && s.holdsNothing()) }

func (s *Session) holdsNothing() bool {
	p := &s.producer
	return len(s.consumer.requests) == 0 && len(p.requests) == 0 && len(p.jobs) == 0 && len(p.transfers) == 0
}

// busy tells the owner that the session took on a request; an ended one
// (a reaped source a pull still names) has nothing to tick.
func (s *Session) busy() {
	if s.env.Busy != nil && !s.dead {
		s.env.Busy(s)
	}
}

func (s *Session) protocolError(reason string) {
	s.env.Logf(s.failLevel(), "%s: protocol error: %s; disconnecting", s.describe(), reason)
	if !s.Ready() {
		s.failHandshake(CauseProtocol)
	}
	s.deathLogged = !s.dead
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
	s.report(Report{Kind: Ended})
}

// CloseOrderly is Close as normal lifecycle (idle eviction, a peer that
// reconnected): the owner logs it at INFO.
func (s *Session) CloseOrderly(reason string) {
	if !s.dead {
		s.orderly = true
	}
	s.Close(reason)
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
	if gr, ok := s.env.Data.(data.Granter); ok && s.grants != (data.Grants{}) {
		gr.Revoke(s.peerID, s.grants)
		s.grants = data.Grants{}
	}
	s.consumer.close()
	s.producer.close()
}

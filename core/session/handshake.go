package session

import (
	"bytes"
	"crypto/hmac"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/protocol"
)

// handshakeStep is where our side of the handshake stands.
type handshakeStep int8

const (
	awaitingPeerConnect handshakeStep = iota // the peer's connect not yet seen
	awaitingProof                            // secret set: our proof sent, the peer's not yet verified
	awaitingPaths                            // secret set: the peer proved it; its data paths not yet seen
	registering                              // the peer's data path registering
	acked                                    // we acked the peer's connect
)

// handshake is where a session's handshake with its peer stands: what each
// side sent and proved, the messages waiting for it to finish, and the
// refusal policy. Its step changes only through the methods below.
type handshake struct {
	step        handshakeStep
	connectSent bool
	sendReady   bool // the peer acked our connect
	queued      []protocol.Message
	peer        *protocol.Connect // the peer's connect, once it passed our checks
	peerRows    uint64            // rows the peer says its region has (connect, or peerkv_paths with a secret)
	nonce       []byte            // our challenge to the peer (secret set)
	peerNonce   []byte            // the peer's challenge to us
	seen        *PeerConnect      // the peer's connect as it arrived, before our checks
	peerEpoch   uint64            // the epoch in the peer's connect (0: none sent)
	// quietRefusal: refuse a stock peer without a goodbye (see RefuseQuietly).
	quietRefusal bool
	// probing: we opened this session as a handshake-only probe (NewProbe);
	// probed: the peer's connect marked it as one. Either way no rows move.
	probing, probed bool
}

func newHandshake(secret, probing bool) handshake {
	h := handshake{probing: probing}
	if secret {
		h.nonce = newNonce()
	}
	return h
}

// over: the peer acked our connect and we acked its.
func (h *handshake) over() bool { return h.sendReady && h.step == acked }

// sawConnect records the peer's connect as it arrived; a second one is a
// protocol error.
func (h *handshake) sawConnect(c *protocol.Connect, now time.Time) error {
	if h.step != awaitingPeerConnect {
		return errors.New("duplicate connect")
	}
	h.seen = &PeerConnect{At: now, PeerID: c.PeerID, BlockLen: c.BlockLen, NumBlocks: c.NumBlocks,
		ConfigFingerprint: c.ConfigFingerprint, HashSeed: c.HashSeed, PeerKV: c.PeerKV != nil}
	if c.PeerKV != nil {
		h.seen.CapsVersion, h.seen.DataTransport = c.PeerKV.Version, c.PeerKV.DataTransport
		h.seen.Challenges = len(c.PeerKV.Nonce) > 0
		h.peerEpoch = c.PeerKV.Epoch
	}
	return nil
}

// probedBy records a peer's connect that marks it a handshake-only probe;
// only a peer that dialed us can be one. It reports whether c did.
func (h *handshake) probedBy(c *protocol.Connect, dialed bool) bool {
	if c.PeerKV == nil || !c.PeerKV.Probe || dialed {
		return false
	}
	h.probed = true
	return true
}

// accepted: the peer's connect passed our checks.
func (h *handshake) accepted(c *protocol.Connect) { h.peer = c }

// challenged: the peer's connect passed and carried its challenge; our
// proof goes out and the peer's is awaited.
func (h *handshake) challenged(nonce []byte) {
	h.peerNonce = bytes.Clone(nonce)
	h.step = awaitingProof
}

// expect refuses a message of the handshake that may not come in its step.
func (h *handshake) expect(step handshakeStep, what string) error {
	if h.step != step {
		return fmt.Errorf("unexpected %s", what)
	}
	return nil
}

// proved: the peer proved the secret; its data paths are awaited.
func (h *handshake) proved() {
	if h.step == awaitingProof {
		h.step = awaitingPaths
	}
}

// registering: the peer's data path registers; rows is its region's size.
func (h *handshake) registering(rows uint64) {
	h.step = registering
	h.peerRows = rows
}

// registered acks the peer once its data path registered; false when the
// handshake is not registering (a late or repeated completion).
func (h *handshake) registered() bool {
	if h.step != registering {
		return false
	}
	h.step = acked
	return true
}

// peerAcked records the peer's ack of our connect; false if it came before.
func (h *handshake) peerAcked() bool {
	if h.sendReady {
		return false
	}
	h.sendReady = true
	return true
}

// sentConnect: our connect went out.
func (h *handshake) sentConnect() { h.connectSent = true }

func (h *handshake) queue(m protocol.Message) { h.queued = append(h.queued, m) }

// unqueue takes m back from the messages waiting for the handshake,
// reporting whether it was there (so never sent).
func (h *handshake) unqueue(m protocol.Message) bool {
	if i := slices.Index(h.queued, m); i >= 0 {
		h.queued = slices.Delete(h.queued, i, i+1)
		return true
	}
	return false
}

// takeQueued returns and forgets what waited for the handshake.
func (h *handshake) takeQueued() []protocol.Message {
	q := h.queued
	h.queued = nil
	return q
}

func (h *handshake) dropQueued() { h.queued = nil }

// refusesType says why no message of type t may come in the handshake's
// step, or nil. connect and disconnect may always come.
func (h *handshake) refusesType(t protocol.Type) error {
	switch t {
	case protocol.TypeConnect, protocol.TypeDisconnect:
		return nil
	}
	if h.peer == nil {
		return fmt.Errorf("%s before connect", t)
	}
	switch t {
	case protocol.TypeConnectAck, protocol.TypeProof, protocol.TypePaths:
		return nil
	}
	// A peer may send requests only after our ack: vLLM queues them until
	// then, and so do we.
	if h.step != acked {
		return fmt.Errorf("%s before the handshake finished", t)
	}
	if h.probed {
		return fmt.Errorf("%s from a probe (a probe's session carries no requests)", t)
	}
	return nil
}

// refusesQuietly: a refusal of this peer sends no goodbye.
func (h *handshake) refusesQuietly() bool {
	return h.quietRefusal && h.seen != nil && !h.seen.PeerKV
}

// stalled says what the handshake still waits for, at its deadline.
func (h *handshake) stalled() string {
	switch h.step {
	case awaitingProof:
		return "the peer never proved the auth secret (a stock vLLM peer, or a peer without auth_secret)"
	case awaitingPaths:
		return "the peer proved the secret but sent no data paths (it rejected our proof: check its log)"
	case registering:
		return "data path registration did not finish"
	case acked:
		return "the peer never acked our connect (it rejected us: check its log for a block_len, fingerprint, hash seed or authentication mismatch)"
	}
	return "no connect from the peer"
}

// restarted: see Session.Restarted; over says whether the handshake is over.
func (h *handshake) restarted(c *protocol.Connect, over bool) (bool, string) {
	if h.seen == nil {
		return false, "" // no connect seen yet: this one is the handshake's
	}
	var epoch uint64
	if c.PeerKV != nil {
		epoch = c.PeerKV.Epoch
	}
	switch {
	case epoch == 0 && h.peerEpoch == 0:
		// Only once the handshake is over: before, a stock peer's connect
		// is the one our own refusal drew (see RefuseQuietly), not a restart.
		if !over {
			return false, ""
		}
		return true, "it sent a new connect (a peer without restart epochs: a new session on its side)"
	case epoch != h.peerEpoch:
		return true, fmt.Sprintf("it restarted (epoch %016x, was %016x)", epoch, h.peerEpoch)
	}
	return false, ""
}

// RefuseQuietly makes a refusal of a stock vLLM peer send no goodbye, as
// vLLM's own refusals do. A stock peer opens a session, and sends its
// connect, for any frame from a peer it holds none with: the owner sets
// this on the session that goodbye of ours drew, so two ends that refuse
// each other stop after one exchange instead of trading connects and
// goodbyes for as long as both run.
func (s *Session) RefuseQuietly() { s.hs.quietRefusal = true }

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
	if s.ended.dead {
		return false, ""
	}
	return s.hs.restarted(c, s.Ready())
}

// Verifies reports whether this session's pulls are verified: both sides
// offered the same row checksum in their connects.
func (s *Session) Verifies() bool {
	p := s.hs.peer
	return !s.env.Cfg.NoVerifyPulls && p != nil && p.PeerKV != nil && p.PeerKV.Verify == protocol.VerifyXXH3
}

// offeredVerify is the row checksum c offers ("" for none).
func offeredVerify(c *protocol.Connect) string {
	if c.PeerKV == nil {
		return ""
	}
	return c.PeerKV.Verify
}

// checkFields refuses a connect whose block_len, fingerprint or hash seed
// differ from ours, naming every one that does: in the log with both
// values, and to a peerkv peer by name only (a stranger learns no value).
// It reports whether it refused.
func (s *Session) checkFields(c *protocol.Connect) bool {
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
	if s.hs.probed && len(causes) == 1 && causes[0] == CauseBlockLen {
		return false // a probe's own block_len: answered once the rest passed (refuseProbeBlockLen)
	}
	if len(causes) == 0 {
		return false
	}
	reason := strings.Join(why, "; ")
	s.env.Logf(s.failLevel(), "rejecting %s: %s", s.describe(), reason)
	if c.PeerKV == nil || cfg.AuthSecret != "" {
		// With a secret, a dialer that has not proved it yet learns nothing.
		names = nil
	}
	s.refuse(causes[0], "rejected its connect: "+reason, names)
	return true
}

// refuseProbeBlockLen answers a probe that passed every other check but
// gave another block_len (it may not know ours): our connect first, which
// tells it ours, then the refusal naming block_len.
func (s *Session) refuseProbeBlockLen(c *protocol.Connect) error {
	if !s.hs.connectSent {
		s.sendConnect()
	}
	s.env.Logf("INFO", "rejecting %s: block_len %d, local %d (our connect told it ours)", s.describe(),
		c.BlockLen, s.env.Region.RowLen)
	s.refuse(CauseBlockLen, fmt.Sprintf("rejected its connect: block_len mismatch: probe %d bytes per row, local %d",
		c.BlockLen, s.env.Region.RowLen), []string{"block_len"})
	return nil
}

func (s *Session) onConnect(c *protocol.Connect) error {
	if err := s.hs.sawConnect(c, s.env.Now()); err != nil {
		return err
	}
	if s.hs.probedBy(c, s.dialed) {
		s.env.Logf("INFO", "%s connected: handshake only (its outcome is logged at INFO and counted as no "+
			"rejection; it may send no requests)", s.describe())
	}
	if s.checkFields(c) {
		return nil
	}
	cfg := s.env.Cfg
	// vLLM sends its own id as both; a mismatch is a confused or lying peer.
	if c.PeerID != s.peerID {
		return s.reject(CauseIdentity, "its connect names %q but its connection identity is %q", c.PeerID, s.peerID)
	}
	if c.PeerID == s.env.LocalID {
		return s.reject(CauseIdentity, "it claims our own id %q", c.PeerID)
	}
	if s.hs.probed && c.BlockLen != s.env.Region.RowLen {
		return s.refuseProbeBlockLen(c)
	}
	s.hs.accepted(c)
	if v := offeredVerify(c); !cfg.NoVerifyPulls && v != "" && v != protocol.VerifyXXH3 {
		s.env.Logf("WARNING", "%s offers the row checksum %q, this node %q: pulls between them are not verified "+
			"(run peerkv releases that share one)", s.describe(), v, protocol.VerifyXXH3)
	}
	if cfg.AuthSecret != "" {
		n, err := peerNonce(c)
		if err != nil {
			return s.reject(CauseAuth, "authentication failed: %v", err)
		}
		s.hs.challenged(n)
		if !s.hs.connectSent {
			s.sendConnect()
		}
		s.sendNow(&protocol.Proof{PeerID: s.env.LocalID,
			Proof: proof(cfg.AuthSecret, s.env.LocalID, s.peerID, s.hs.peerNonce, s.hs.nonce)})
		return nil
	}
	if !s.hs.connectSent {
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
	if err := s.hs.expect(awaitingProof, "peerkv_proof"); err != nil {
		return err
	}
	want := proof(s.env.Cfg.AuthSecret, s.peerID, s.env.LocalID, s.hs.nonce, s.hs.peerNonce)
	if m.PeerID != s.peerID || !hmac.Equal(m.Proof, want) {
		return s.reject(CauseAuth, "authentication failed: its proof does not match our auth secret "+
			"(a different secret on that peer, or a proof replayed or relayed from another session)")
	}
	s.hs.proved()
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
	p.MAC = pathsMAC(s.env.Cfg.AuthSecret, s.env.LocalID, s.peerID, s.hs.peerNonce, s.hs.nonce, p)
	s.sendNow(p)
	return nil
}

// onPaths registers the data paths of a peer that proved the secret.
func (s *Session) onPaths(m *protocol.Paths) error {
	if err := s.hs.expect(awaitingPaths, "peerkv_paths"); err != nil {
		return err
	}
	if !hmac.Equal(m.MAC, pathsMAC(s.env.Cfg.AuthSecret, s.peerID, s.env.LocalID, s.hs.nonce, s.hs.peerNonce, m)) {
		return s.reject(CauseAuth, "authentication failed: its peerkv_paths were altered or belong to another session")
	}
	s.register(data.PeerInfo{
		AgentMetadata: bytes.Clone(m.AgentMetadata),
		BaseAddr:      m.BaseAddr,
		NumRows:       m.NumBlocks,
		RowLen:        s.hs.peer.BlockLen,
		DataAddr:      m.DataAddr,
		Grants:        data.Grants{SameHost: m.SameHost, DataToken: m.DataToken},
	})
	return nil
}

func (s *Session) register(info data.PeerInfo) {
	s.hs.registering(info.NumRows)
	s.env.Register(s, info)
}

// RegistrationDone completes the handshake once the peer's data path is
// registered: only then may the peer send (our ack is its permission).
func (s *Session) RegistrationDone(err error) {
	if s.ended.dead || s.hs.step != registering {
		return
	}
	if err != nil {
		s.env.Logf(s.failLevel(), "rejecting %s: data path registration failed: %v", s.describe(), err)
		s.refuse(CauseDataPath, fmt.Sprintf("data path registration failed: %v", err), nil)
		return
	}
	s.hs.registered()
	s.sendNow(&protocol.ConnectAck{PeerID: s.env.LocalID})
	s.flushQueued()
}

func (s *Session) onConnectAck() {
	if s.hs.peerAcked() {
		s.flushQueued()
	}
}

// flushQueued sends what waited for the handshake once both sides acked.
func (s *Session) flushQueued() {
	if !s.Ready() {
		return
	}
	for _, m := range s.hs.takeQueued() {
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
	s.hs.sentConnect()
	c := &protocol.Connect{
		PeerID:            s.env.LocalID,
		AgentMetadata:     []byte{},
		NumBlocks:         1,
		BlockLen:          s.env.Region.RowLen,
		ConfigFingerprint: s.env.Cfg.ConfigFingerprint,
		HashSeed:          s.env.Cfg.HashSeed,
	}
	caps := &protocol.Capabilities{Version: capabilitiesVersion, Nonce: []byte{}, Epoch: s.env.Epoch, Probe: s.hs.probing}
	if !s.env.Cfg.NoVerifyPulls {
		caps.Verify = protocol.VerifyXXH3
	}
	if s.env.Cfg.AuthSecret != "" {
		caps.Nonce = s.hs.nonce
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

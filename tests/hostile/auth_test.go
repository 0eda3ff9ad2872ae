package hostile

import (
	"bytes"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/protocol"
)

const secret = "s"

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// v3Connect is the connect of the authenticated handshake: placeholders and
// this session's challenge.
func v3Connect(id string, nonce []byte) *protocol.Connect {
	return &protocol.Connect{
		PeerID: id, AgentMetadata: []byte{}, BaseAddr: 0, NumBlocks: 1, BlockLen: RowLen,
		ConfigFingerprint: Fingerprint, HashSeed: HashSeed,
		PeerKV: &protocol.Capabilities{Version: 2, DataTransport: "", DataAddr: "", Nonce: nonce},
	}
}

// proofMAC is HMAC-SHA256(secret, "peerkv-proof-v3", sender, receiver,
// receiver's nonce, sender's nonce), each field u64 big-endian length + bytes.
func proofMAC(key, sender, receiver string, receiverNonce, senderNonce []byte) []byte {
	m := hmac.New(sha256.New, []byte(key))
	for _, f := range [][]byte{[]byte("peerkv-proof-v3"), []byte(sender), []byte(receiver), receiverNonce, senderNonce} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(f)))
		m.Write(n[:])
		m.Write(f)
	}
	return m.Sum(nil)
}

func proofMsg(sender string, proof []byte) map[string]any {
	return map[string]any{"type": "peerkv_proof", "peer_id": sender, "proof": proof}
}

// authFailed matches a log line naming an authentication failure of peerID.
func authFailed(peerID string) string {
	q := regexp.QuoteMeta(peerID)
	return `(?i)(` + q + `.*authenticat|authenticat.*` + q + `)`
}

// rejected matches any refusal of peerID.
func rejected(peerID string) string {
	q := regexp.QuoteMeta(peerID)
	return `(?i)(` + q + `.*(authenticat|reject|refus)|(authenticat|reject|refus).*` + q + `)`
}

func secretNode(t *testing.T) *Node { return OpenNode(t, map[string]any{"auth_secret": secret}) }

// notRegistered checks that n registered no data path for peerID.
func notRegistered(t *testing.T, n *Node, peerID, what string) {
	t.Helper()
	assert.False(t, n.Registered(peerID), "%s: %s registered a data path for %s: %s", what, n.ID(), peerID, tail(n.Logs()))
	if v, ok := n.Gauge("data_peers"); ok {
		assert.Zero(t, v, "%s: %s holds data-path registrations (data_peers)", what, n.ID())
	}
}

// Case 2a. Without the secret, claiming the identity of a real node A
// toward C gets nowhere, and C says why.
func TestAuthImpostorWithoutSecret(t *testing.T) {
	t.Parallel()
	A, C := secretNode(t), secretNode(t)
	a := NewAttacker(t, "127.0.0.1")
	c := a.Dial(C.ID(), A.ID(), "")
	c.Send(v3Connect(A.ID(), randomBytes(16)))
	c.SendMap(proofMsg(A.ID(), randomBytes(32)))
	c.Send(&protocol.ConnectAck{PeerID: A.ID()})
	line, ok := C.LogMatch(authFailed(A.ID()), 3*time.Second)
	assert.True(t, ok, "C logged no authentication failure for an impostor claiming %s: %s", A.ID(), tail(C.Logs()))
	t.Logf("C: %s", line)
	time.Sleep(300 * time.Millisecond)
	notRegistered(t, C, A.ID(), "impostor")
	within(t, 4*time.Second, func() bool { return C.Stats().Sessions == 0 },
		"C still holds a session for the impostor (sessions=%d)", C.Stats().Sessions)
}

// Case 2b. What a real node A sent to the attacker (its connect and, with
// the challenge handshake, its proof) does not authenticate the attacker as
// A toward another node C.
func TestAuthReplayedProofFails(t *testing.T) {
	t.Parallel()
	A, C := secretNode(t), secretNode(t)
	a := NewAttacker(t, "127.0.0.1")

	// Capture: A dials the attacker (a consumer request pulling from it).
	A.Consume("lure", uniq("lure"), a.ID)
	x := a.Dial(A.ID(), a.ID, "")
	conn := x.MustAwait("connect", 3*time.Second)
	x.Send(v3Connect(a.ID, randomBytes(16)))
	proof, gotProof := x.Await("peerkv_proof", 2*time.Second)
	t.Logf("captured A's connect (%d bytes) and proof: %v", len(conn.Raw), gotProof)

	// Replay toward C under A's identity.
	r := a.Dial(C.ID(), A.ID(), "")
	r.SendRaw(conn.Raw)
	if gotProof {
		r.SendRaw(proof.Raw)
	}
	r.Send(&protocol.ConnectAck{PeerID: A.ID()})
	_, ok := C.LogMatch(authFailed(A.ID()), 3*time.Second)
	assert.True(t, ok, "C logged no authentication failure for a replay of A's messages: %s", tail(C.Logs()))
	notRegistered(t, C, A.ID(), "replayed proof")
	require.NoError(t, A.FinishRequest("lure"))
}

// Case 2c. The target's own proof reflected back to it (with its own
// challenge echoed as ours) does not authenticate us.
func TestAuthReflectedProofFails(t *testing.T) {
	t.Parallel()
	T := secretNode(t)
	a := NewAttacker(t, "127.0.0.1")
	T.Consume("lure", uniq("lure"), a.ID)
	x := a.Dial(T.ID(), a.ID, "")
	theirs := x.MustAwait("connect", 3*time.Second)
	caps := theirs.Sub(protocol.CapabilitiesKey)
	require.NotNil(t, caps, "the target's connect has no peerkv capabilities")
	if auth, _ := caps["auth"].([]byte); len(auth) > 0 {
		// Revision 1 proves in the connect itself: reflect the whole connect.
		t.Logf("the target proves the secret in its connect (revision 1): reflecting it")
		x.SendRaw(theirs.Raw)
	} else {
		nonce, _ := caps["nonce"].([]byte)
		x.Send(v3Connect(a.ID, nonce)) // its own challenge, echoed
		if p, ok := x.Await("peerkv_proof", 2*time.Second); ok {
			x.SendMap(proofMsg(a.ID, p.Bytes("proof")))
		} else {
			t.Logf("the target sent no proof after an echoed challenge")
		}
	}
	x.Send(&protocol.ConnectAck{PeerID: a.ID})
	_, paths := x.Await("peerkv_paths", 1500*time.Millisecond)
	assert.False(t, paths, "the target sent its data paths to a peer that reflected its own proof")
	_, acked := x.Await("connect_ack", 200*time.Millisecond)
	assert.False(t, acked, "the target acked a peer that reflected its own proof")
	_, ok := T.LogMatch(rejected(a.ID), 2*time.Second)
	assert.True(t, ok, "the target logged no refusal of the reflecting peer: %s", tail(T.Logs()))
	notRegistered(t, T, a.ID, "reflected proof")
	require.NoError(t, T.FinishRequest("lure"))
}

// Case 2d. A correct session's connect and proof, replayed verbatim into a
// later session, do not authenticate: each session has its own challenge.
func TestAuthStaleConnectNeverAuthenticates(t *testing.T) {
	t.Parallel()
	C := secretNode(t)
	a := NewAttacker(t, "127.0.0.1")

	// Session 1, by a peer that knows the secret (the traffic an
	// eavesdropper records).
	s1 := a.Dial(C.ID(), a.ID, "")
	ours := randomBytes(16)
	connect, err := protocol.Encode(v3Connect(a.ID, ours))
	require.NoError(t, err)
	s1.SendRaw(connect)
	cc := s1.MustAwait("connect", 3*time.Second)
	challenge, _ := cc.Sub(protocol.CapabilitiesKey)["nonce"].([]byte)
	require.GreaterOrEqual(t, len(challenge), 16, "C's connect carries no challenge: %v", cc.Map)
	proof := EncodeMap(proofMsg(a.ID, proofMAC(secret, a.ID, C.ID(), challenge, ours)))
	s1.SendRaw(proof)
	_, ok := s1.Await("peerkv_paths", 3*time.Second)
	require.True(t, ok, "positive control: C did not accept a correct peerkv_proof (no peerkv_paths within 3 s): %s",
		tail(C.Logs()))
	s1.Send(&protocol.Disconnect{})
	s1.CloseAfterFlush()
	within(t, 4*time.Second, func() bool { return C.Stats().Sessions == 0 }, "C kept session 1")
	a.Relisten(a.ID) // a fresh ROUTER: C's new DEALER must not collide with its old one

	// Session 2: the recorded frames, verbatim, without the secret.
	s2 := a.Dial(C.ID(), a.ID, "")
	s2.SendRaw(connect)
	if cc2, ok := s2.Await("connect", 2*time.Second); ok {
		n2, _ := cc2.Sub(protocol.CapabilitiesKey)["nonce"].([]byte)
		assert.False(t, bytes.Equal(n2, challenge), "C reused session 1's challenge in session 2")
	}
	s2.SendRaw(proof)
	s2.Send(&protocol.ConnectAck{PeerID: a.ID})
	_, paths := s2.Await("peerkv_paths", 1500*time.Millisecond)
	assert.False(t, paths, "C accepted session 1's proof replayed into session 2")
	_, acked := s2.Await("connect_ack", 200*time.Millisecond)
	assert.False(t, acked, "C acked a replayed stale connect")
	_, ok = C.LogMatch(authFailed(a.ID), 2*time.Second)
	assert.True(t, ok, "C logged no authentication failure for the stale replay: %s", tail(C.Logs()))
}

package session

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/protocol"
)

func withSecret(s string) func(*config.Config) { return func(c *config.Config) { c.AuthSecret = s } }

func TestAuthenticatedHandshakeRegistersOnlyProvenPaths(t *testing.T) {
	p := newPair(t, withSecret("s"))
	connect := p.a.sent[0].(*protocol.Connect)
	assert.Zero(t, connect.BaseAddr, "a connect carries nothing of our region before the peer proved the secret")
	assert.Empty(t, connect.AgentMetadata)
	assert.Equal(t, uint64(1), connect.NumBlocks)
	assert.Empty(t, connect.PeerKV.SameHost)
	assert.Len(t, connect.PeerKV.Nonce, nonceLen)
	assert.Empty(t, p.b.sent, "the acceptor speaks only once the dialer's connect arrived")
	for _, m := range p.a.take() {
		p.sb.Handle(m)
	}
	require.Equal(t, []protocol.Type{protocol.TypeConnect, protocol.TypeProof}, types(p.b.sent))
	assert.Empty(t, p.b.sent[0].(*protocol.Connect).AgentMetadata, "with a secret the acceptor's connect is a bare challenge too")
	assert.Zero(t, p.b.sent[0].(*protocol.Connect).BaseAddr)

	p.pump()
	require.True(t, p.sa.Ready())
	require.True(t, p.sb.Ready())
	require.Len(t, p.b.register, 1)
	assert.Equal(t, p.a.env.Region.BaseAddr(), p.b.register[0].BaseAddr, "the real region arrives in peerkv_paths")
	assert.Equal(t, uint64(testRows), p.b.register[0].NumRows)
}

func TestWrongSecretIsRefusedBothWays(t *testing.T) {
	p := &pair{a: newOwner(t, "127.0.0.1:1001", withSecret("s")), b: newOwner(t, "127.0.0.1:1002", withSecret("other"))}
	p.sa = p.a.open("127.0.0.1:1002", true)
	p.sb = p.b.open("127.0.0.1:1001", false)
	p.pump()
	assert.True(t, p.sa.Dead())
	assert.True(t, p.sb.Dead())
	assert.Empty(t, p.a.register)
	assert.Empty(t, p.b.register)
	assert.Contains(t, p.b.logs[len(p.b.logs)-1], "authentication failed")
}

// A proof captured from one session is worthless in any other: it names
// both ends and the receiver's fresh challenge.
func TestCapturedProofCannotBeReplayedRelayedOrReflected(t *testing.T) {
	// The attacker X dials A and records A's connect and proof.
	a := newOwner(t, "127.0.0.1:1001", withSecret("s"))
	aSeesX := a.open("127.0.0.1:6666", false)
	x := newOwner(t, "127.0.0.1:6666", withSecret("guess"))
	xToA := x.open("127.0.0.1:1001", true)
	aSeesX.Handle(x.take()[0])
	fromA := a.take()
	require.Equal(t, []protocol.Type{protocol.TypeConnect, protocol.TypeProof}, types(fromA))
	captured := fromA[1].(*protocol.Proof)
	_ = xToA

	t.Run("relayed to another node as A", func(t *testing.T) {
		c := newOwner(t, "127.0.0.1:1003", withSecret("s"))
		cSeesA := c.open("127.0.0.1:1001", false)
		forged := fromA[0].(*protocol.Connect) // A's genuine connect, replayed to C
		cSeesA.Handle(forged)
		cSeesA.Handle(captured)
		assert.True(t, cSeesA.Dead())
		assert.Empty(t, c.register)
		assert.Contains(t, c.logs[len(c.logs)-1], "authentication failed")
	})
	t.Run("reflected back to A", func(t *testing.T) {
		a2 := newOwner(t, "127.0.0.1:1001", withSecret("s"))
		s := a2.open("127.0.0.1:6666", false)
		s.Handle(&protocol.Connect{PeerID: "127.0.0.1:6666", AgentMetadata: []byte{}, NumBlocks: 1, BlockLen: testRowLen,
			HashSeed: "42", PeerKV: &protocol.Capabilities{Version: 2, Nonce: fromA[0].(*protocol.Connect).PeerKV.Nonce}})
		s.Handle(&protocol.Proof{PeerID: "127.0.0.1:6666", Proof: captured.Proof})
		assert.True(t, s.Dead())
		assert.Empty(t, a2.register)
	})
	t.Run("replayed into a later session with A", func(t *testing.T) {
		again := a.open("127.0.0.1:6666", false)
		again.Handle(&protocol.Connect{PeerID: "127.0.0.1:6666", AgentMetadata: []byte{}, NumBlocks: 1, BlockLen: testRowLen,
			HashSeed: "42", PeerKV: &protocol.Capabilities{Version: 2, Nonce: make([]byte, nonceLen)}})
		again.Handle(&protocol.Proof{PeerID: "127.0.0.1:6666", Proof: captured.Proof})
		assert.True(t, again.Dead())
		assert.Empty(t, a.register)
	})
}

func TestAlteredPathsAreRefused(t *testing.T) {
	p := newPair(t, withSecret("s"))
	for range 3 { // connect, proof, then A's paths
		fromA, fromB := p.a.take(), p.b.take()
		for _, m := range fromA {
			if paths, ok := m.(*protocol.Paths); ok {
				paths.BaseAddr += 4096 // an on-path attacker redirects B's writes
			}
			p.sb.Handle(m)
		}
		for _, m := range fromB {
			p.sa.Handle(m)
		}
	}
	assert.True(t, p.sb.Dead())
	assert.Empty(t, p.b.register)
}

func TestStockPeerIsRefusedWhenASecretIsSet(t *testing.T) {
	b := newOwner(t, "127.0.0.1:1002", withSecret("s"))
	s := b.open("127.0.0.1:1001", false)
	s.Handle(&protocol.Connect{PeerID: "127.0.0.1:1001", AgentMetadata: []byte{1}, BaseAddr: 1 << 40, NumBlocks: 8,
		BlockLen: testRowLen, HashSeed: "42"})
	assert.True(t, s.Dead())
	assert.Contains(t, b.logs[len(b.logs)-1], "stock vLLM peer")
	assert.Empty(t, b.register)
	// A goodbye and nothing else: a connect of ours would open a new session
	// there if its own had ended, and the connect that draws would be
	// refused again, for as long as both ran.
	assert.Equal(t, []protocol.Type{protocol.TypeDisconnect}, types(b.take()))
}

func TestAcceptorSpeaksOnlyAfterTheDialersConnectPassed(t *testing.T) {
	b := newOwner(t, "127.0.0.1:1002")
	s := b.open("127.0.0.1:1001", false)
	assert.Empty(t, b.sent, "nothing about our region goes to a stranger")
	s.Handle(&protocol.Connect{PeerID: "127.0.0.1:1001", AgentMetadata: []byte{}, NumBlocks: 8, BlockLen: testRowLen,
		HashSeed: "a different seed"})
	assert.Equal(t, []protocol.Type{protocol.TypeDisconnect}, types(b.take()), "rejected before we sent our connect")

	b2 := newOwner(t, "127.0.0.1:1002")
	s2 := b2.open("127.0.0.1:1001", false)
	s2.Handle(&protocol.Connect{PeerID: "127.0.0.1:1001", AgentMetadata: []byte{}, NumBlocks: 8, BlockLen: testRowLen, HashSeed: "42"})
	assert.Equal(t, []protocol.Type{protocol.TypeConnect, protocol.TypeConnectAck}, types(b2.take()))
}

func TestConnectNamingAnotherIdentityOrOursIsRefused(t *testing.T) {
	for name, id := range map[string]string{"another": "127.0.0.1:9999", "ours": "127.0.0.1:1002"} {
		t.Run(name, func(t *testing.T) {
			b := newOwner(t, "127.0.0.1:1002")
			s := b.open(id, false)
			s.Handle(&protocol.Connect{PeerID: "127.0.0.1:1001", AgentMetadata: []byte{}, NumBlocks: 8, BlockLen: testRowLen, HashSeed: "42"})
			assert.True(t, s.Dead())
			assert.Empty(t, b.register)
		})
	}
}

func TestRequestsBeforeTheHandshakeAreProtocolErrors(t *testing.T) {
	for _, m := range []protocol.Message{
		&protocol.Lookup{KVRequestID: "k", Keys: [][]byte{key(1)}},
		&protocol.Fetch{KVRequestID: "k", Keys: [][]byte{key(1)}, BlockIndexes: []uint64{0}},
		&protocol.TransferDone{KVRequestID: "k"},
	} {
		b := newOwner(t, "127.0.0.1:1002", withSecret("s"))
		s := b.open("127.0.0.1:1001", false)
		s.Handle(&protocol.Connect{PeerID: "127.0.0.1:1001", AgentMetadata: []byte{}, NumBlocks: 1, BlockLen: testRowLen,
			HashSeed: "42", PeerKV: &protocol.Capabilities{Version: 2, Nonce: make([]byte, nonceLen)}})
		s.Handle(m)
		assert.True(t, s.Dead(), "%s", m.MsgType())
		assert.Contains(t, s.DeathReason(), "before the handshake finished")
		assert.Empty(t, b.inbound)
	}
}

func TestRevisionOnePeerIsToldToUpgrade(t *testing.T) {
	b := newOwner(t, "127.0.0.1:1002", withSecret("s"))
	s := b.open("127.0.0.1:1001", false)
	s.Handle(&protocol.Connect{PeerID: "127.0.0.1:1001", AgentMetadata: []byte{}, NumBlocks: 1, BlockLen: testRowLen,
		HashSeed: "42", PeerKV: &protocol.Capabilities{Version: 1, Nonce: make([]byte, nonceLen)}})
	assert.True(t, s.Dead())
	assert.Contains(t, b.logs[len(b.logs)-1], "upgrade it")
}

func TestHalfOpenHandshakeIsDroppedAtItsDeadline(t *testing.T) {
	b := newOwner(t, "127.0.0.1:1002", withSecret("s"), func(c *config.Config) { c.HandshakeTimeout = 2 * time.Second })
	s := b.open("127.0.0.1:1001", false)
	s.Handle(&protocol.Connect{PeerID: "127.0.0.1:1001", AgentMetadata: []byte{}, NumBlocks: 1, BlockLen: testRowLen,
		HashSeed: "42", PeerKV: &protocol.Capabilities{Version: 2, Nonce: make([]byte, nonceLen)}})
	b.tick(time.Second)
	assert.False(t, s.Dead())
	b.tick(1500 * time.Millisecond)
	assert.True(t, s.Dead(), "a peer that never proves the secret holds its slot only until the deadline")
	assert.Contains(t, s.DeathReason(), "never proved the auth secret")
}

// offeringData is a data path that grants, recording revocations.
type offeringData struct {
	data.Transport
	offers, withdrawn []string
}

func (o *offeringData) Grant(peerID string, g *data.Grants) {
	g.SameHost = fmt.Sprintf("v1 grant-%d-for-%s", len(o.offers), peerID)
	g.DataToken = fmt.Sprintf("token-%d", len(o.offers))
	o.offers = append(o.offers, g.SameHost)
}
func (o *offeringData) Revoke(peerID string, g data.Grants) {
	o.withdrawn = append(o.withdrawn, g.SameHost)
}

func TestASessionWithdrawsItsSameHostGrantWhenItCloses(t *testing.T) {
	a := newOwner(t, "127.0.0.1:1001")
	od := &offeringData{Transport: a.env.Data}
	a.env.Data = od
	s := a.open("127.0.0.1:1002", true)
	c := a.take()[0].(*protocol.Connect)
	require.Len(t, od.offers, 1)
	assert.Equal(t, od.offers[0], c.PeerKV.SameHost, "the grant goes to this peer only, in our connect")
	assert.Equal(t, "token-0", c.PeerKV.DataToken, "and the data token")
	s.Close("done", Failure)
	s.Release()
	assert.Equal(t, od.offers, od.withdrawn, "no grant outlives its session")
}

func TestRejectionNamesEveryRefusedFieldToPeerKVPeersOnly(t *testing.T) {
	caps := &protocol.Capabilities{Version: 1, Nonce: []byte{}}
	for name, c := range map[string]*protocol.Capabilities{"peerkv": caps, "stock": nil} {
		t.Run(name, func(t *testing.T) {
			b := newOwner(t, "127.0.0.1:1002")
			s := b.open("127.0.0.1:1001", false)
			s.Handle(&protocol.Connect{PeerID: "127.0.0.1:1001", AgentMetadata: []byte{}, NumBlocks: 8,
				BlockLen: testRowLen * 2, HashSeed: "another seed", PeerKV: c})
			require.True(t, s.Dead())
			sent := b.take()
			require.Len(t, sent, 1)
			d := sent[0].(*protocol.Disconnect)
			if c != nil {
				assert.Equal(t, []string{"block_len", "hash_seed"}, d.Refused)
			} else {
				assert.Empty(t, d.Refused, "a stock peer gets vLLM's plain disconnect")
			}
			assert.Contains(t, b.logs[len(b.logs)-1], "block_len mismatch")
			assert.Contains(t, b.logs[len(b.logs)-1], "hash seed mismatch")
			seen, ok := s.Seen()
			require.True(t, ok)
			assert.Equal(t, uint64(testRowLen*2), seen.BlockLen)
		})
	}
	// The dialer learns which fields, not the values.
	a := newOwner(t, "127.0.0.1:1001")
	s := a.open("127.0.0.1:1002", true)
	s.Handle(&protocol.Disconnect{Refused: []string{"hash_seed"}})
	require.True(t, s.Dead())
	assert.Equal(t, []string{"hash_seed"}, s.Refused())
	assert.Contains(t, s.DeathReason(), "naming as different from its own: hash_seed")
}

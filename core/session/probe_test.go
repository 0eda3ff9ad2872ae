package session

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/protocol"
)

// A probe (`peerkv doctor`) handshakes and nothing more: a request from its
// session is a protocol error, and every line about it is INFO.
func TestAProbeSendsNoRequestsAndIsToldAuthSecret(t *testing.T) {
	a, b := newOwner(t, "127.0.0.1:1001"), newOwner(t, "127.0.0.1:1002")
	probe := NewProbe(a.env, "127.0.0.1:1002")
	probed := b.open("127.0.0.1:1001", false)
	require.True(t, a.sent[0].(*protocol.Connect).PeerKV.Probe, "the probe's connect says so")
	for range 4 {
		for _, m := range a.take() {
			probed.Handle(m)
		}
		for _, m := range b.take() {
			probe.Handle(m)
		}
	}
	require.True(t, probe.Ready())
	require.True(t, probed.Ready())
	assert.True(t, probed.Probe())
	probed.Handle(&protocol.Lookup{KVRequestID: "r", Keys: [][]byte{make([]byte, testKeyLen)}, RoundSeq: 1})
	assert.True(t, probed.Dead(), "a probe's session carries no requests")
	assert.Contains(t, probed.DeathReason(), "from a probe")
	for _, line := range b.logs {
		assert.Regexp(t, "^(INFO|DEBUG) ", line)
	}

	// Refused for the auth secret, a probe is told which check, never why.
	c := newOwner(t, "127.0.0.1:1003", withSecret("s"))
	s := c.open("127.0.0.1:1001", false)
	s.Handle(&protocol.Connect{PeerID: "127.0.0.1:1001", AgentMetadata: []byte{}, NumBlocks: 1, BlockLen: testRowLen,
		HashSeed: "42", PeerKV: &protocol.Capabilities{Version: 2, Nonce: []byte{}, Probe: true}})
	require.True(t, s.Dead())
	goodbye := c.sent[len(c.sent)-1].(*protocol.Disconnect)
	assert.Equal(t, []string{"auth_secret"}, goodbye.Refused)
	assert.Regexp(t, "^INFO rejecting probe 127.0.0.1:1001 \\(peerkv doctor\\): authentication failed", c.logs[len(c.logs)-1])
}

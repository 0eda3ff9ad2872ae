package tier

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/protocol"
)

const secret = "s3cret"

// signedConnect is a connect as a peer knowing secret sends it at issued.
func signedConnect(issued time.Time, nonce byte) *protocol.Connect {
	c := &protocol.Connect{
		PeerID: "10.0.0.1:5710", AgentMetadata: []byte("nixl agent md"), BaseAddr: 0x7f0000000000,
		NumBlocks: 64, BlockLen: 4096, ConfigFingerprint: "0123456789abcdef", HashSeed: "1234",
	}
	caps := &protocol.Capabilities{
		Version: capabilitiesVersion, DataTransport: "nixl+tcp", DataAddr: "10.0.0.1:40000",
		Nonce: []byte{nonce, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15}, IssuedAtMs: uint64(issued.UnixMilli()),
	}
	caps.Auth = connectProof(secret, c, caps)
	c.PeerKV = caps
	return c
}

func authTier(now time.Time) *Tier {
	return &Tier{cfg: config.Config{AuthSecret: secret}, now: func() time.Time { return now }}
}

func TestAuthAcceptsAGenuineConnectOnce(t *testing.T) {
	now := time.Now()
	tr := authTier(now)
	c := signedConnect(now, 1)
	require.NoError(t, tr.authenticate(c))

	err := tr.authenticate(c)
	require.Error(t, err, "the same connect again is a replay")
	assert.Contains(t, err.Error(), "replay")
	require.NoError(t, tr.authenticate(signedConnect(now, 2)), "a fresh nonce is fine")
}

func TestAuthProofCoversEveryConnectField(t *testing.T) {
	now := time.Now()
	for name, alter := range map[string]func(c *protocol.Connect){
		"peer_id":            func(c *protocol.Connect) { c.PeerID = "10.0.0.9:5710" },
		"agent_metadata":     func(c *protocol.Connect) { c.AgentMetadata = []byte("attacker's agent") },
		"base_addr":          func(c *protocol.Connect) { c.BaseAddr += 4096 },
		"num_blocks":         func(c *protocol.Connect) { c.NumBlocks++ },
		"block_len":          func(c *protocol.Connect) { c.BlockLen *= 2 },
		"config_fingerprint": func(c *protocol.Connect) { c.ConfigFingerprint = "fedcba9876543210" },
		"hash_seed":          func(c *protocol.Connect) { c.HashSeed = "5678" },
		"data_transport":     func(c *protocol.Connect) { c.PeerKV.DataTransport = "tcp" },
		"data_addr":          func(c *protocol.Connect) { c.PeerKV.DataAddr = "10.6.6.6:40000" },
		"nonce":              func(c *protocol.Connect) { c.PeerKV.Nonce[0] ^= 0xff },
		"issued_at_ms":       func(c *protocol.Connect) { c.PeerKV.IssuedAtMs++ },
	} {
		t.Run(name, func(t *testing.T) {
			c := signedConnect(now, 1)
			alter(c)
			err := authTier(now).authenticate(c)
			require.Error(t, err)
			assert.Contains(t, err.Error(), "does not match our auth_secret")
		})
	}
}

func TestAuthRefusesStaleAndFutureConnects(t *testing.T) {
	now := time.Now()
	for name, issued := range map[string]time.Time{
		"stale":  now.Add(-authWindow - time.Second),
		"future": now.Add(authWindow + time.Second),
	} {
		t.Run(name, func(t *testing.T) {
			err := authTier(now).authenticate(signedConnect(issued, 1))
			require.Error(t, err)
			assert.Contains(t, err.Error(), "beyond")
		})
	}
	assert.NoError(t, authTier(now).authenticate(signedConnect(now.Add(-authWindow/2), 1)), "skew within the window is fine")
}

func TestAuthRefusesWrongSecretAndMissingProof(t *testing.T) {
	now := time.Now()
	c := signedConnect(now, 1)
	c.PeerKV.Auth = connectProof("other secret", c, c.PeerKV)
	require.ErrorContains(t, authTier(now).authenticate(c), "does not match our auth_secret")

	c.PeerKV = nil // a stock vLLM peer
	require.ErrorContains(t, authTier(now).authenticate(c), "no proof")
}

func TestNonceCacheForgetsAfterTheWindow(t *testing.T) {
	var n nonceCache
	start := time.Now()
	nonce := []byte("0123456789abcdef")
	require.NoError(t, n.admit(nonce, uint64(start.UnixMilli()), start))
	later := start.Add(authWindow + time.Second)
	// The old entry is pruned; the old connect itself is refused as stale.
	require.ErrorContains(t, n.admit(nonce, uint64(start.UnixMilli()), later), "beyond")
	assert.Empty(t, n.seen, "entries past their window are dropped")
}

package hostile

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/protocol"
)

func bootID(t *testing.T) string {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	require.NoError(t, err)
	return strings.TrimSpace(string(b))
}

// leaks lists what of this host a connect from the target gives away.
func leaks(t *testing.T, f Frame) []string {
	var out []string
	if f.Uint("base_addr") != 0 {
		out = append(out, "base_addr")
	}
	caps := f.Sub(protocol.CapabilitiesKey)
	for _, k := range []string{"local_process", "same_host"} {
		if v, ok := caps[k]; ok && v != "" {
			out = append(out, "peerkv."+k)
		}
	}
	if bytes.Contains(f.Raw, []byte(bootID(t))) {
		out = append(out, "the boot id")
	}
	return out
}

// Case 14, without a secret: the accepting side answers a dialer's connect
// with its own only once the dialer's passed validation, so a stranger with
// the wrong layout, fingerprint or seed learns nothing of the region, pid,
// boot id or same-host grant.
func TestAcceptingSideSendsNoConnectBeforeValidation(t *testing.T) {
	t.Parallel()
	T := OpenShmNode(t, sameHostOptions(nil))
	a := NewAttacker(t, "127.0.0.1")
	for _, tc := range []struct {
		name   string
		mutate func(*protocol.Connect)
	}{
		{"block_len", func(c *protocol.Connect) { c.BlockLen = 2 * RowLen }},
		{"config_fingerprint", func(c *protocol.Connect) { c.ConfigFingerprint = "fedcba9876543210" }},
		{"hash_seed", func(c *protocol.Connect) { c.HashSeed = "43" }},
	} {
		id := a.Listen("127.0.0.1")
		c := a.Dial(T.ID(), id, "")
		m := a.ConnectMsg(id)
		tc.mutate(m)
		c.Send(m)
		if f, got := c.Await("connect", time.Second); got {
			assert.Fail(t, "the accepting side answered an invalid connect with its own",
				"dialer's %s is wrong, yet the target sent its connect (leaking %v; base_addr=%#x peerkv=%v)",
				tc.name, leaks(t, f), f.Uint("base_addr"), f.Sub(protocol.CapabilitiesKey))
		}
	}
	// A valid dialer does get the target's connect.
	id := a.Listen("127.0.0.1")
	c := a.Dial(T.ID(), id, "")
	c.Send(a.ConnectMsg(id))
	c.MustAwait("connect", 3*time.Second)
}

// Case 14, with a secret: every connect, to a dialer or when dialing,
// carries placeholders only: the data paths come after the proofs.
func TestConnectWithSecretCarriesPlaceholders(t *testing.T) {
	t.Parallel()
	T := OpenShmNode(t, sameHostOptions(map[string]any{"auth_secret": "s"}))
	a := NewAttacker(t, "127.0.0.1")
	check := func(how string, f Frame) {
		t.Helper()
		caps := f.Sub(protocol.CapabilitiesKey)
		require.NotNil(t, caps, "%s: connect without peerkv capabilities", how)
		assert.Empty(t, f.Bytes("agent_metadata"), "%s: agent_metadata", how)
		assert.Zero(t, f.Uint("base_addr"), "%s: base_addr", how)
		assert.Equal(t, uint64(1), f.Uint("num_blocks"), "%s: num_blocks", how)
		assert.Equal(t, uint64(2), asUint(caps["version"]), "%s: peerkv.version", how)
		assert.Equal(t, "", caps["data_transport"], "%s: peerkv.data_transport", how)
		assert.Equal(t, "", caps["data_addr"], "%s: peerkv.data_addr", how)
		nonce, _ := caps["nonce"].([]byte)
		assert.GreaterOrEqual(t, len(nonce), 16, "%s: peerkv.nonce is the session's challenge", how)
		auth, _ := caps["auth"].([]byte)
		assert.Empty(t, auth, "%s: peerkv.auth", how)
		assert.Empty(t, leaks(t, f), "%s: the connect leaks", how)
	}
	// The target accepts: first an invalid dialer, then a valid-looking one.
	id := a.Listen("127.0.0.1")
	c := a.Dial(T.ID(), id, "")
	bad := v3Connect(id, randomBytes(16))
	bad.BlockLen = 2 * RowLen
	c.Send(bad)
	if f, got := c.Await("connect", time.Second); got {
		check("answering an invalid dialer", f)
	}
	c = a.Dial(T.ID(), a.ID, "")
	c.Send(v3Connect(a.ID, randomBytes(16)))
	check("accepting", c.MustAwait("connect", 3*time.Second))
	// The target dials.
	lure := a.Listen("127.0.0.1")
	T.Consume("lure", uniq("lure"), lure)
	f, ok := a.Await(Is(T.ID(), lure, "connect"), 3*time.Second)
	require.True(t, ok, "the target dialed no connect to %s", lure)
	check("dialing", f)
	require.NoError(t, T.FinishRequest("lure"))
}

package session

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/protocol"
)

// A peer that never answers our connect (a black hole) must not hold a
// request's lookups for handshake_timeout_s: they are MISS lookup_timeout_s
// after the first ask, though no lookup could be sent.
func TestLookupsBeforeAHandshakeThatNeverEndsMissAtTheLookupDeadline(t *testing.T) {
	o := newOwner(t, "127.0.0.1:1001", func(c *config.Config) {
		c.HandshakeTimeout = 30 * time.Second
		c.LookupTimeout = 2 * time.Second
	})
	s := o.open("127.0.0.1:1002", true)
	o.take() // our connect, never answered
	_, known := s.RegisterLookup("kv", key(1))
	require.False(t, known)
	s.FlushLookups()
	assert.Empty(t, o.take(), "nothing is sent before the handshake")

	o.tick(1500 * time.Millisecond)
	_, known = s.RegisterLookup("kv", key(2)) // a later key of the same request: the request's first ask counts
	require.False(t, known)
	o.tick(400 * time.Millisecond)
	_, known = s.Probed("kv", key(1))
	assert.False(t, known, "still waiting before lookup_timeout_s")

	o.tick(200 * time.Millisecond) // 2.1 s after the first ask, far inside the handshake's 30 s
	for _, k := range [][]byte{key(1), key(2)} {
		hit, known := s.Probed("kv", k)
		assert.True(t, known, "answered at lookup_timeout_s from the first ask")
		assert.False(t, hit)
	}
	assert.Contains(t, o.answered, "kv", "the owner is told, so the host hears MISS")
	assert.False(t, s.Dead(), "the session itself waits for its own deadline")
	assert.Contains(t, strings.Join(o.logs, "\n"), "handshake has not finished", "the cause is named")

	// The handshake finishing later sends no lookup for keys already settled.
	b := newOwner(t, "127.0.0.1:1002")
	sb := b.open("127.0.0.1:1001", false)
	p := &pair{a: o, b: b, sa: s, sb: sb}
	sb.Handle(&protocol.Connect{PeerID: "127.0.0.1:1001", BlockLen: testRowLen, NumBlocks: testRows, HashSeed: "42",
		AgentMetadata: []byte{}, PeerKV: &protocol.Capabilities{Version: capabilitiesVersion, Nonce: []byte{}}})
	p.pump()
	require.True(t, s.Ready())
	s.FlushLookups()
	assert.Empty(t, o.take())
}

// A lookup's deadline still runs from the first ask when the handshake
// finishes in between: it is not restarted when the lookup goes out.
func TestALookupSentLateKeepsTheDeadlineOfItsFirstAsk(t *testing.T) {
	p := newPair(t, func(c *config.Config) { c.LookupTimeout = 2 * time.Second })
	_, known := p.sa.RegisterLookup("kv", key(1))
	require.False(t, known)
	p.a.tick(1500 * time.Millisecond)
	p.pump() // the handshake finishes; the lookup goes out 1.5 s after the ask
	require.True(t, p.sa.Ready())
	p.a.tick(600 * time.Millisecond)
	hit, known := p.sa.Probed("kv", key(1))
	assert.True(t, known, "MISS 2 s after the first ask, not 2 s after the send")
	assert.False(t, hit)
}

// A load whose fetch never left (the handshake never finished) is reported
// failed at load_timeout_s: no abort is sent, so no ack is waited for.
func TestALoadWhoseFetchNeverWentOutIsReportedAtTheLoadDeadline(t *testing.T) {
	o := newOwner(t, "127.0.0.1:1001", func(c *config.Config) {
		c.HandshakeTimeout = 30 * time.Second
		c.LoadTimeout = 5 * time.Second
		c.AbortAckTimeout = 10 * time.Second
	})
	s := o.open("127.0.0.1:1002", true)
	o.take()
	s.RequestBlocks(7, "kv", [][]byte{key(1)}, []uint64{3})
	o.tick(4900 * time.Millisecond)
	assert.NotContains(t, o.loads, int64(7))
	o.tick(200 * time.Millisecond)
	ok, done := o.loads[7]
	require.True(t, done, "reported at load_timeout_s, not abort_ack_timeout_s later")
	assert.False(t, ok)
	assert.Empty(t, o.take(), "neither the fetch nor an abort of it is ever sent")
	assert.False(t, s.HasPendingWork() && len(s.hs.queued) > 0, "nothing of the load stays queued")
}

// The same when the owner aborts the load (its own deadline) first.
func TestAnAbortOfALoadWhoseFetchNeverWentOutReportsItAtOnce(t *testing.T) {
	o := newOwner(t, "127.0.0.1:1001")
	s := o.open("127.0.0.1:1002", true)
	o.take()
	round := s.RequestBlocks(7, "kv", [][]byte{key(1)}, []uint64{3})
	s.AbortLoad("kv", round)
	ok, done := o.loads[7]
	require.True(t, done)
	assert.False(t, ok)
	s.RequestBlocks(8, "kv2", [][]byte{key(2)}, []uint64{4})
	s.FinishConsumer("kv2")
	_, done = o.loads[8]
	assert.True(t, done, "a finished request's unsent load is reported at once too")
	assert.Empty(t, s.hs.queued)
}

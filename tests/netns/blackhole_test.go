package netns

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	holeLookup    = 2 * time.Second // lookup_timeout_s of the consumers
	holeHandshake = 8 * time.Second // handshake_timeout_s: far from lookup_timeout_s
	// holeMissBound is the lookup_timeout_s + 0.5 s, with room for
	// a loaded 2-core machine, and still far below holeHandshake.
	holeMissBound = holeLookup + 1500*time.Millisecond
	// atOnce bounds a MISS during the back-off: no wait on the network.
	atOnce = time.Second
)

// A P2P source's address becomes a black hole (every packet to it dropped
// at the router, no ICMP). A consumer with a session to it, and one that
// never reached it (its dial never completes), both answer MISS within
// lookup_timeout_s of the first ask, not handshake_timeout_s; once the
// handshake timed out the second consumer backs the source off, so its next
// request is MISS at once; when the hole closes both are served again; every
// job of the three hosts is reported once (issue 38, item 3).
func TestBlackHoledSourceMissesAtTheLookupDeadline(t *testing.T) {
	t.Parallel()
	s, w, c := newHostIndex(), newHostIndex(), newHostIndex()
	consumer := func(i int) map[string]any {
		return hostOptions(i, map[string]any{"lookup_timeout_s": holeLookup.Seconds(), "handshake_timeout_s": holeHandshake.Seconds()})
	}
	src := startHost(t, s, "source", hostOptions(s, nil))
	warm := startHost(t, w, "consumer with a session", consumer(w))
	cold := startHost(t, c, "consumer without one", consumer(c))
	src.call(nil, replyWithin, "hold block")
	ask := func(h *host, within time.Duration) lookupResult {
		var r lookupResult
		h.call(&r, within+replyWithin, "lookup block %s %d %d", hostIP(s), peerPort, within.Milliseconds())
		return r
	}
	require.Equal(t, "HIT", ask(warm, replyWithin).Result, "the source serves before the black hole")

	cutOff(t, s)
	r := ask(warm, 3*holeHandshake)
	t.Logf("black-holed source, session open: %s after %d ms (lookup_timeout_s %v, handshake_timeout_s %v)", r.Result, r.Ms, holeLookup.Seconds(), holeHandshake.Seconds())
	assert.Equal(t, "MISS", r.Result)
	assert.Less(t, r.Ms, holeMissBound.Milliseconds(), "a session whose source went silent misses at lookup_timeout_s")

	r = ask(cold, 3*holeHandshake)
	t.Logf("black-holed source, never reached: %s after %d ms", r.Result, r.Ms)
	assert.Equal(t, "MISS", r.Result)
	assert.Less(t, r.Ms, holeMissBound.Milliseconds(), "a dial that never completes misses at lookup_timeout_s, not handshake_timeout_s")

	// The handshake times out at holeHandshake; the cause is known once a
	// dial of its own (5 s at most) finds the packets dropped.
	var st nodeStats
	for deadline := time.Now().Add(holeHandshake + replyWithin); ; time.Sleep(100 * time.Millisecond) {
		cold.call(&st, replyWithin, "stats")
		if st.PeerConnectFailures["timeout"] > 0 {
			break
		}
		require.True(t, time.Now().Before(deadline), "no connect failure named timeout: %v", st.PeerConnectFailures)
	}
	r = ask(cold, 3*holeHandshake)
	t.Logf("during the back-off: %s after %d ms", r.Result, r.Ms)
	assert.Equal(t, "MISS", r.Result)
	assert.Less(t, r.Ms, atOnce.Milliseconds(), "a backed-off source misses at once")

	require.NoError(t, reconnect(s))
	lifted := time.Now()
	for _, h := range []*host{cold, warm} {
		for ask(h, replyWithin).Result != "HIT" {
			require.Less(t, time.Since(lifted), 2*replyWithin, "%s is not served again after the black hole", h.name)
			time.Sleep(250 * time.Millisecond)
		}
		t.Logf("%s served again %v after the black hole closed", h.name, time.Since(lifted).Round(time.Millisecond))
	}

	for _, h := range []*host{src, warm, cold} {
		var l ledgerState
		h.call(&l, 2*replyWithin, "ledger %d", replyWithin.Milliseconds())
		assert.Empty(t, l.Problems, "%s reported a job twice or one never submitted", h.name)
		assert.Empty(t, l.Unreported, "%s never reported these jobs", h.name)
		t.Logf("%s: %d jobs submitted, %d reported", h.name, l.Submitted, l.Reported)
	}
}

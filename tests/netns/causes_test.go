package netns

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	causeLookup    = time.Second     // lookup_timeout_s of the consumer
	causeHandshake = 3 * time.Second // handshake_timeout_s: short, so a silent peer's episode comes soon
	// causeNamed bounds how long a cause takes to be known: the handshake
	// timing out, then a diagnosis of its own (5 s at most), with room.
	causeNamed = causeHandshake + 5*time.Second + 10*time.Second
)

// A consumer asks four sources it cannot reach, each for its own reason,
// across real namespaces: one whose address has nothing listening (the
// router's own), one on a network with no route (the router answers
// ICMP net unreachable), one whose host name does not resolve, and one
// whose packets are dropped (a blackhole route). Each request is MISS
// within lookup_timeout_s; each failed connect is counted under its cause
// in peer_connect_failures, and each peer is named once in the log with
// that word, however many connects of its episode fail (issue 38, items 3
// and 7: no libzmq event names stand for the cause).
func TestUnreachableSourcesAreNamedByCause(t *testing.T) {
	t.Parallel()
	c := newHostIndex()
	silent := "10.38.250.2" // no host: the router drops its packets
	require.NoError(t, ip("route", "add", "blackhole", silent+"/32"))
	t.Cleanup(func() { _ = ip("route", "del", "blackhole", silent+"/32") })
	sources := []struct{ cause, host string }{
		{"refused", fmt.Sprintf("10.38.%d.1", c)},
		{"unreachable", "10.39.0.2"},
		{"unresolvable", "no-such-peer.invalid"},
		{"timeout", silent},
	}
	cons := startHost(t, c, "consumer", hostOptions(c, map[string]any{
		"lookup_timeout_s": causeLookup.Seconds(), "handshake_timeout_s": causeHandshake.Seconds()}))
	type source = struct{ cause, host string }
	ask := func(group []source) {
		for _, s := range group {
			var r lookupResult
			cons.call(&r, 2*causeLookup+replyWithin, "lookup block %s %d %d", s.host, peerPort, (2 * causeLookup).Milliseconds())
			assert.Equal(t, "MISS", r.Result, "source %s (%s)", s.host, s.cause)
			assert.Less(t, r.Ms, (causeLookup + 1500*time.Millisecond).Milliseconds(), "source %s (%s) held a lookup past lookup_timeout_s", s.host, s.cause)
		}
	}
	// waitCounts waits until each cause of group counted at least n failed connects.
	waitCounts := func(group []source, n int64) nodeStats {
		var st nodeStats
		for deadline := time.Now().Add(causeNamed); ; time.Sleep(100 * time.Millisecond) {
			cons.call(&st, replyWithin, "stats")
			all := true
			for _, s := range group {
				all = all && st.PeerConnectFailures[s.cause] >= n
			}
			if all {
				return st
			}
			require.True(t, time.Now().Before(deadline), "not every cause counted %d failed connects within %v: %v", n, causeNamed, st.PeerConnectFailures)
		}
	}

	// The causes known at once, then those known once the handshake timed
	// out: an episode is forgotten handshake_timeout_s + 5 s after its
	// back-off, so each group's second request comes within its episode.
	var st nodeStats
	for _, group := range [][]source{sources[:2], sources[2:]} {
		ask(group)
		waitCounts(group, 1)
		// Once the back-off (1 s, from when the cause was known) is over,
		// the next request dials again, and fails again.
		time.Sleep(1500 * time.Millisecond)
		ask(group)
		st = waitCounts(group, 2)
	}
	t.Logf("peer_connect_failures after two requests to each: %v", st.PeerConnectFailures)

	logs := cons.logs.String()
	for _, s := range sources {
		line := fmt.Sprintf("cannot connect to peer %s:%d (%s)", s.host, peerPort, s.cause)
		assert.Equal(t, 1, strings.Count(logs, line), "%q once for the episode", line)
	}
	assert.NotContains(t, logs, "EVENT_CLOSED", "a connect that failed is named by its cause, not by libzmq's event")
}

// A consumer's TCP connect to a PD producer's control port succeeds, then
// every packet it sends there is dropped (the producer never hears the
// handshake): its load is reported failed within load_timeout_s, with no
// abort sent and no abort ack awaited (abort_ack_timeout_s 10 s more),
// and every job is reported once (issue 38, item 5).
func TestALoadWhoseHandshakeNeverFinishedIsReportedAtItsDeadline(t *testing.T) {
	t.Parallel()
	const loadTimeout = 3 * time.Second
	p, c := newHostIndex(), newHostIndex()
	prod := startHost(t, p, "producer", hostOptions(p, nil))
	cons := startHost(t, c, "consumer", hostOptions(c, map[string]any{
		"load_timeout_s": loadTimeout.Seconds(), "abort_ack_timeout_s": 10.0, "handshake_timeout_s": 30.0}))
	// The SYN passes, and the producer's answers: the consumer's TCP
	// connection is up; what it sends after its SYN is dropped.
	filter(t, fmt.Sprintf("ip saddr %s ip daddr %s tcp dport %d tcp flags != syn drop", hostIP(c), hostIP(p), peerPort))
	prod.call(nil, replyWithin, "store cut %d", pullRows)
	var r loadResult
	cons.call(&r, loadWithin+replyWithin, "load cut %d %s %d %d", pullRows, hostIP(p), peerPort, (4 * loadTimeout).Milliseconds())
	t.Logf("a load on a session whose handshake never finished: success %v, reported after %d ms (load_timeout_s %v)",
		r.Success, r.Ms, loadTimeout.Seconds())
	require.True(t, r.Reported, "the load was not reported")
	assert.False(t, r.Success)
	assert.Less(t, r.Ms, (loadTimeout + 1500*time.Millisecond).Milliseconds(), "reported at load_timeout_s, no abort ack awaited")
	var l ledgerState
	cons.call(&l, 2*replyWithin, "ledger %d", replyWithin.Milliseconds())
	assert.Empty(t, l.Problems, "the consumer reported a job twice or one never submitted")
	assert.Empty(t, l.Unreported, "the consumer never reported these jobs")
}

package node

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/tier"
)

// lookupUntilSettled asks key of req until it is not RETRY, sending the
// lookups as the host's step end would, and returns the answer and how
// long it took.
func lookupUntilSettled(t *testing.T, tr *tier.Tier, req string, within time.Duration) (tier.LookupResult, time.Duration) {
	t.Helper()
	key := make([]byte, 36)
	copy(key, req)
	out := make([]tier.LookupResult, 1)
	start := time.Now()
	for time.Since(start) < within {
		require.NoError(t, tr.Lookup(req, [][]byte{key}, out))
		require.NoError(t, tr.OnScheduleEnd())
		if out[0] != tier.Retry {
			return out[0], time.Since(start)
		}
		time.Sleep(2 * time.Millisecond)
	}
	t.Fatalf("request %s still RETRY after %v", req, within)
	return 0, 0
}

func startPullFrom(t *testing.T, tr *tier.Tier, req, hostPort string) {
	t.Helper()
	host, port, err := net.SplitHostPort(hostPort)
	require.NoError(t, err)
	_, err = tr.StartRequest(req, []byte(fmt.Sprintf(
		`{"remote_kv_source":{"kv_request_id":%q,"remote_host":%q,"remote_port":%s}}`, "kv-"+req, host, port)))
	require.NoError(t, err)
}

// A source that accepts TCP but never completes the ZMQ handshake (a frozen
// engine, or a port that is not a peer's): its lookups are MISS within
// lookup_timeout_s of the first ask, not handshake_timeout_s; once the
// handshake timed out the cause is named once, and new requests to it are
// MISS at once during the back-off.
func TestASilentSourceMissesAtTheLookupDeadlineThenIsBackedOff(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		var held []net.Conn // accepted, never answered
		for {
			c, err := ln.Accept()
			if err != nil {
				for _, c := range held {
					_ = c.Close()
				}
				return
			}
			held = append(held, c)
		}
	}()
	cons, err := Open(testConfig(t, `,"lookup_timeout_s":1,"handshake_timeout_s":3`), testRegion())
	require.NoError(t, err)
	t.Cleanup(func() { _ = cons.Shutdown() })

	startPullFrom(t, cons, "r0", ln.Addr().String())
	res, took := lookupUntilSettled(t, cons, "r0", 10*time.Second)
	t.Logf("silent source: MISS after %v (lookup_timeout_s 1, handshake_timeout_s 3)", took)
	assert.Equal(t, tier.Miss, res)
	assert.Less(t, took, 2500*time.Millisecond, "settled near lookup_timeout_s, far from handshake_timeout_s")

	require.Eventually(t, func() bool { return cons.Stats().PeerConnectFailures["timeout"] == 1 },
		15*time.Second, 10*time.Millisecond, "%+v", cons.Stats().PeerConnectFailures)
	startPullFrom(t, cons, "r1", ln.Addr().String())
	res, took = lookupUntilSettled(t, cons, "r1", time.Second)
	assert.Equal(t, tier.Miss, res)
	t.Logf("during the back-off: MISS after %v", took)
	logs := string(cons.TakeLogs(1 << 20))
	assert.Equal(t, 1, strings.Count(logs, "cannot connect to peer "+ln.Addr().String()+" (timeout)"), logs)
	assert.Contains(t, logs, "never answers")
}

// A port nothing listens on is named as refused, in words, not as a lost
// connection.
func TestARefusedSourceIsNamedAsRefused(t *testing.T) {
	cons, err := Open(testConfig(t, ""), testRegion())
	require.NoError(t, err)
	t.Cleanup(func() { _ = cons.Shutdown() })
	nobody := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	startPullFrom(t, cons, "r0", nobody)
	res, took := lookupUntilSettled(t, cons, "r0", 10*time.Second)
	t.Logf("refused source: MISS after %v", took)
	assert.Equal(t, tier.Miss, res)
	var logs strings.Builder
	require.Eventually(t, func() bool {
		logs.Write(cons.TakeLogs(1 << 20))
		return strings.Contains(logs.String(), "cannot connect to peer "+nobody+" (refused): connection refused")
	}, 10*time.Second, 10*time.Millisecond, "logs: %s", logs.String())
	assert.NotContains(t, logs.String(), "EVENT_CLOSED")
	assert.EqualValues(t, 1, cons.Stats().PeerConnectFailures["refused"])
}

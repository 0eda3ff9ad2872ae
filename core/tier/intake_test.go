package tier_test

import (
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/control/zmqctl"
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/protocol"
	"github.com/peerkv/peerkv/core/tier"
)

// A frame from an identity without a session is dropped from its type
// alone, and so is a request from a session whose handshake is not over:
// neither is decoded. A connect is.
func TestFramesTheSenderMayNotSendAreNotDecoded(t *testing.T) {
	c := newCluster(t)
	slow := &countingData{addDelay: time.Second} // keeps the handshake registering
	p := c.wrappedNode(1, slow)
	stranger := c.raw("127.0.0.1:7301")
	stranger.send(p.id, &protocol.Lookup{KVRequestID: "x", Keys: keys(1, 2, 3)})
	require.Eventually(t, func() bool { return p.Stats().DroppedFrames == 1 }, 3*time.Second, time.Millisecond)
	assert.Zero(t, p.FramesDecoded(), "a sessionless lookup was decoded past its type")

	early := c.raw("127.0.0.1:7302")
	early.connect(p.id)
	require.Eventually(t, func() bool { return p.Stats().Sessions == 1 }, 3*time.Second, time.Millisecond)
	assert.EqualValues(t, 1, p.FramesDecoded(), "a connect is decoded")
	early.send(p.id, &protocol.Lookup{KVRequestID: "y", Keys: keys(1, 2, 3)})
	require.Eventually(t, func() bool { return p.Stats().Sessions == 0 }, 3*time.Second, time.Millisecond,
		"a lookup before the handshake finished is a protocol error")
	assert.EqualValues(t, 1, p.FramesDecoded(), "a lookup before the handshake finished was decoded")
	assert.Contains(t, string(p.TakeLogs(1<<16)), "lookup before the handshake finished")
}

// lookupFrame hand-builds a lookup of n keys of keyLen bytes, as large as
// max_list_items lets a stranger send.
func lookupFrame(n int) []byte {
	b := []byte{0x84}
	b = appendStr(b, "type")
	b = appendStr(b, "lookup")
	b = appendStr(b, "kv_request_id")
	b = appendStr(b, "flood")
	b = appendStr(b, "keys")
	b = append(b, 0xdd)
	b = binary.BigEndian.AppendUint32(b, uint32(n))
	k := make([]byte, keyLen)
	for i := range n {
		binary.BigEndian.PutUint32(k, uint32(i))
		b = append(b, 0xc4, keyLen)
		b = append(b, k...)
	}
	b = appendStr(b, "round_seq")
	return append(b, 0)
}

func appendStr(b []byte, s string) []byte { return append(append(b, 0xa0|byte(len(s))), s...) }

// zmqTransport binds a real ZMQ control path on a free loopback port.
func zmqTransport(t *testing.T) *zmqctl.Transport {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		port := l.Addr().(*net.TCPAddr).Port
		require.NoError(t, l.Close())
		ctl, err := zmqctl.New(fmt.Sprintf("127.0.0.1:%d", port), "127.0.0.1", port, zmqctl.Options{Logger: quiet,
			SendQueueBytes: 64 << 20}) // room for a 38 MiB frame queued before the DEALER is up
		if err != nil && strings.Contains(err.Error(), "in use") {
			continue // taken since: try another
		}
		require.NoError(t, err)
		t.Cleanup(func() { _ = ctl.Close() })
		return ctl
	}
	t.Fatal("no free loopback port after 20 tries")
	return nil
}

// zmqTier is a peer on a real ZMQ control path on loopback.
func zmqTier(t *testing.T, c *cluster) (*tier.Tier, string) {
	t.Helper()
	ctl := zmqTransport(t)
	cfg := fastConfig(1)
	_, port, _ := net.SplitHostPort(ctl.LocalID())
	_, err := fmt.Sscan(port, &cfg.Port)
	require.NoError(t, err)
	region := data.Region{Mem: make([]byte, numRows*rowLen), RowLen: rowLen}
	tr, err := tier.New(cfg, region, tier.Deps{
		Control: ctl,
		NewData: func(guard data.WriteGuard, _ tier.Logf) (data.Transport, error) {
			return c.data.Transport(ctl.LocalID(), region, guard), nil
		},
	})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Shutdown() })
	return tr, ctl.LocalID()
}

// A stranger flooding the control port with the largest lookups a frame
// may carry (max_list_items keys, 38 MiB) does not slow the scheduler
// thread's host calls: nothing of a sessionless frame is decoded, and
// nothing is decoded under the lock those calls take. Before, each such
// frame was decoded under it, and peerkv_lookup took 80-250 ms.
func TestAStrangersLargeFramesDoNotStallHostCalls(t *testing.T) {
	c := newCluster(t)
	victim, victimID := zmqTier(t, c)
	attacker := zmqTransport(t)
	frame := lookupFrame(protocol.DefaultMaxListItems)
	t.Logf("each frame: %.1f MiB, %d keys", float64(len(frame))/(1<<20), protocol.DefaultMaxListItems)

	const frames = 8
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var slowest time.Duration
	calls := 0
	wg.Add(1)
	go func() { // the scheduler thread
		defer wg.Done()
		ks, out := keys(1, 2, 3, 4, 5, 6, 7, 8), make([]tier.LookupResult, 8)
		for {
			select {
			case <-stop:
				return
			default:
			}
			start := time.Now()
			assert.NoError(t, victim.Lookup("r", ks, out))
			slowest = max(slowest, time.Since(start))
			calls++
			time.Sleep(200 * time.Microsecond)
		}
	}()
	for range frames {
		require.NoError(t, attacker.Send(victimID, frame))
		time.Sleep(250 * time.Millisecond)
	}
	require.Eventually(t, func() bool { return victim.Stats().DroppedFrames >= frames }, 30*time.Second, 10*time.Millisecond,
		"the victim did not take the flood: %+v", victim.Stats())
	close(stop)
	wg.Wait()
	t.Logf("slowest of %d host lookups during the flood: %v (target < 5 ms)", calls, slowest)
	assert.Less(t, slowest, 50*time.Millisecond, "a stranger's frames stalled host calls")
}

// A stranger's frames are dropped without the lock host calls take: while
// a goroutine holds it (as one preempted while holding it would), the
// frames of an identity with no session are still taken and dropped, so a
// flood of them never queues behind the lock nor adds to its holders.
func TestAStrangersFramesAreDroppedWithoutTheLock(t *testing.T) {
	c := newCluster(t)
	victim, victimID := zmqTier(t, c)
	attacker := zmqTransport(t)
	release := victim.HoldLock()
	released := false
	defer func() {
		if !released {
			release()
		}
	}()
	for range 3 {
		require.NoError(t, attacker.Send(victimID, lookupFrame(8)))
	}
	var logs strings.Builder
	dropped := func() bool {
		logs.Write(victim.TakeLogs(1 << 16)) // the log is not under the lock
		return strings.Contains(logs.String(), "dropping a frame from "+attacker.LocalID()+", which has no session")
	}
	require.Eventually(t, dropped, 10*time.Second, 5*time.Millisecond,
		"a stranger's frame waited for the lock: logs %q", logs.String())
	release()
	released = true
	require.Eventually(t, func() bool { return victim.Stats().DroppedFrames == 3 }, 10*time.Second, 5*time.Millisecond,
		"every frame counted once: %+v", victim.Stats())
	assert.Zero(t, victim.FramesDecoded())
}

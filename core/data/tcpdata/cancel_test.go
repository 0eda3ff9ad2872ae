package tcpdata

import (
	"bytes"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/data"
)

// slowLink forwards data connections to a receiver at a fixed rate toward
// it, like a 100 Mbit/s link with a small queue, and records the bytes it
// put on the link and when the last of them went.
type slowLink struct {
	addr        string
	bytesPerSec float64
	sent        atomic.Int64
	lastSent    atomic.Int64 // UnixNano

	mu   sync.Mutex
	free time.Time // when the link has carried every byte booked so far
}

// linkQueueBytes is what the link holds ahead of its rate (the proxy's
// socket receive buffer): a router's small queue, not loopback's megabytes.
const linkQueueBytes = 64 << 10

func newSlowLink(t *testing.T, target string, bytesPerSec float64) *slowLink {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	l := &slowLink{addr: ln.Addr().String(), bytesPerSec: bytesPerSec}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		_ = ln.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			_ = in.(*net.TCPConn).SetReadBuffer(linkQueueBytes)
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, in, out)
			mu.Unlock()
			wg.Add(2)
			go func() { defer wg.Done(); _, _ = io.Copy(in, out); _ = in.Close() }()
			go func() { defer wg.Done(); l.forward(out, in); _ = out.Close() }()
		}
	}()
	return l
}

// forward copies in to out in small slices, each when the link, shared by
// every connection, has carried what went before it at its rate.
func (l *slowLink) forward(out, in net.Conn) {
	buf := make([]byte, 8<<10)
	for {
		n, err := in.Read(buf)
		if n > 0 {
			time.Sleep(time.Until(l.due(n)))
			if _, werr := out.Write(buf[:n]); werr != nil {
				return
			}
			l.sent.Add(int64(n))
			l.lastSent.Store(time.Now().UnixNano())
		}
		if err != nil {
			return
		}
	}
}

// due books n bytes on the link and says when they have crossed it.
func (l *slowLink) due(n int) time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.free.Before(now) {
		l.free = now // idle meanwhile: no burst to catch up
	}
	l.free = l.free.Add(time.Duration(float64(n) / l.bytesPerSec * float64(time.Second)))
	return l.free
}

// Canceled transfers stop putting bytes on a slow link at once, their parts
// not yet sent are dropped, they are reported canceled without waiting for
// their bytes to drain, and the link serves the next transfer.
func TestCanceledTransfersLeaveTheLinkAtOnce(t *testing.T) {
	const (
		rate    = 12.5e6 // 100 Mbit/s
		rows    = 128    // 8 MiB a transfer: 0.67 s on the link
		target  = 100 * time.Millisecond
		allowed = 4 * target // a loaded test machine
	)
	src, dst := randomRegion(t, 3*rows), sentinelRegion(3*rows)
	a := newTransport(t, "a", src, nil)
	b := newTransport(t, "b", dst, nil)
	link := newSlowLink(t, b.DataAddr(), rate)
	require.NoError(t, a.AddPeer("b", data.PeerInfo{NumRows: dst.NumRows(), RowLen: rowLen, DataAddr: link.addr}))
	var c data.Canceler = a

	first, err := a.Write("b", seq(0, rows), seq(0, rows))
	require.NoError(t, err)
	second, err := a.Write("b", seq(rows, rows), seq(rows, rows))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return link.sent.Load() > 2<<20 }, waitLimit, time.Millisecond,
		"the first transfer never got on the link")

	canceledAt, sentBefore := time.Now(), link.sent.Load()
	c.Cancel("b", first)
	c.Cancel("b", second)
	var reportedIn time.Duration
	for range 2 {
		got := nextCompletion(t, a, waitLimit)
		require.ErrorIs(t, got.Err, data.ErrCanceled, "transfer %d", got.ID)
		reportedIn = time.Since(canceledAt)
		assert.Less(t, reportedIn, allowed+time.Second, "reported long after the cancel")
	}
	time.Sleep(allowed) // anything still queued would be on the link by now
	quietAfter := time.Duration(link.lastSent.Load() - canceledAt.UnixNano())
	after := link.sent.Load() - sentBefore
	t.Logf("after the cancel: both reported in %v; %d bytes more on the link, the last %v after it (%.0f%% of both transfers never sent)",
		reportedIn.Round(time.Millisecond), after, quietAfter.Round(time.Millisecond),
		100*(1-float64(link.sent.Load())/float64(2*rows*rowLen)))
	assert.Less(t, quietAfter, allowed, "the link was busy this long after the cancel (target %v)", target)
	assert.Less(t, after, int64(rate*allowed.Seconds()))

	// The link is in step: the next transfer lands whole.
	third, err := a.Write("b", seq(2*rows, rows), seq(2*rows, rows))
	require.NoError(t, err)
	got := nextCompletion(t, a, waitLimit)
	require.Equal(t, third, got.ID)
	require.NoError(t, got.Err)
	require.True(t, bytes.Equal(src.Mem[2*rows*rowLen:], dst.Mem[2*rows*rowLen:]), "the third transfer's rows differ")

	// Canceling what already ended, or someone else's id, changes nothing.
	c.Cancel("b", third)
	c.Cancel("nobody", third)
	select {
	case extra := <-a.Completions():
		t.Fatalf("a second completion: %+v", extra)
	case <-time.After(100 * time.Millisecond):
	}
	require.False(t, errors.Is(got.Err, data.ErrCanceled))
}

package tcpdata

import (
	"bytes"
	"crypto/rand"
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
			_ = out.(*net.TCPConn).SetWriteBuffer(linkQueueBytes) // the queue is small on both sides
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

// A part on the wire when its transfer is canceled stops within a segment,
// not at its end: with 8 MiB rows a part is at least one row, 0.67 s of a
// 100 Mbit/s link, yet the link goes quiet within about 100 ms of the
// cancel, the transfer is reported canceled, and the connections stay in
// step for the next transfer.
func TestCanceledPartStopsWithinASegment(t *testing.T) {
	const (
		bigRow  = 8 << 20
		rows    = 4 // 32 MiB a transfer
		rate    = 12.5e6
		target  = 100 * time.Millisecond
		allowed = 4 * target // a loaded test machine
	)
	src := data.Region{Mem: make([]byte, 2*rows*bigRow), RowLen: bigRow}
	_, err := rand.Read(src.Mem)
	require.NoError(t, err)
	dst := data.Region{Mem: make([]byte, 2*rows*bigRow), RowLen: bigRow}
	a := newTransport(t, "a", src, nil)
	b := newTransport(t, "b", dst, nil)
	link := newSlowLink(t, b.DataAddr(), rate)
	require.NoError(t, a.AddPeer("b", data.PeerInfo{NumRows: dst.NumRows(), RowLen: bigRow, DataAddr: link.addr}))

	id, err := a.Write("b", seq(0, rows), seq(0, rows))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return link.sent.Load() > 2<<20 }, waitLimit, time.Millisecond,
		"the transfer never got on the link")
	canceledAt, sentBefore := time.Now(), link.sent.Load()
	a.Cancel("b", id)
	got := nextCompletion(t, a, waitLimit)
	reportedIn := time.Since(canceledAt)
	require.Equal(t, id, got.ID)
	require.ErrorIs(t, got.Err, data.ErrCanceled)
	time.Sleep(allowed) // anything still queued would be on the link by now
	quietAfter := time.Duration(link.lastSent.Load() - canceledAt.UnixNano())
	after := link.sent.Load() - sentBefore
	t.Logf("after the cancel: reported in %v; %d KiB more on the link, the last %v after it (parts of 8 MiB rows on a 100 Mbit/s link)",
		reportedIn.Round(time.Millisecond), after>>10, quietAfter.Round(time.Millisecond))
	assert.Less(t, quietAfter, allowed, "the link was busy this long after the cancel (target %v)", target)
	assert.Less(t, after, int64(rate*allowed.Seconds()), "bytes put on the link after the cancel")
	assert.Less(t, reportedIn, allowed+time.Second, "reported long after the cancel")

	// The connections are in step: the next transfer lands whole.
	next, err := a.Write("b", seq(rows, 1), seq(rows, 1))
	require.NoError(t, err)
	got = nextCompletion(t, a, waitLimit)
	require.Equal(t, next, got.ID)
	require.NoError(t, got.Err)
	require.True(t, bytes.Equal(src.Row(rows), dst.Row(rows)), "the next transfer's row differs")
}

// slowReader is a receiver's guard that copies rows slowly once slowed (a
// consumer whose reads fell behind), and counts the rows it copied after
// the test marked their transfer reported.
type slowReader struct {
	slow, reported atomic.Bool
	copied, late   atomic.Int64
}

func (g *slowReader) MayWrite(string, uint64) bool { return true }

// WriteRow lets every row in: after an abort's ack the same rows may be a
// new load's from the same peer, so only the data path can keep a stale
// byte out.
func (g *slowReader) WriteRow(_ string, _ uint64, dst, src []byte) bool {
	if g.slow.Load() {
		time.Sleep(4 * time.Millisecond) // 16 MB/s of 64 KiB rows
	}
	if g.reported.Load() {
		g.late.Add(1)
	}
	copy(dst, src)
	g.copied.Add(1)
	return true
}

// No byte of a part cut by a cancel lands after its transfer is reported
// canceled (the report lets the abort be acked, and the consumer hand the
// rows to a new load from the same peer, which the guard lets write them):
// the receiver acks the cut part only after it read every byte sent before
// the cancel marker. A reset of the connection instead, reported at once,
// leaves rows in the socket buffers that a slow reader copies in after the
// report.
func TestNothingOfACanceledPartLandsAfterTheReport(t *testing.T) {
	const rows = 256 // 16 MiB a transfer
	src, dst := randomRegion(t, 2*rows), sentinelRegion(2*rows)
	guard := &slowReader{}
	a := newTransport(t, "a", src, nil)
	b := newTransport(t, "b", dst, func(o *Options) { o.Guard = guard })
	addPeer(t, a, "b", b)

	warm, err := a.Write("b", seq(0, rows), seq(0, rows))
	require.NoError(t, err)
	got := nextCompletion(t, a, waitLimit)
	require.Equal(t, warm, got.ID)
	require.NoError(t, got.Err)

	guard.slow.Store(true) // the consumer falls behind: the socket buffers fill
	copiedBefore := guard.copied.Load()
	id, err := a.Write("b", seq(rows, rows), seq(rows, rows))
	require.NoError(t, err)
	require.Eventually(t, func() bool { return guard.copied.Load() > copiedBefore+8 }, waitLimit, time.Millisecond,
		"the transfer never landed a row")

	canceledAt := time.Now()
	a.Cancel("b", id)
	got = nextCompletion(t, a, waitLimit)
	guard.reported.Store(true)
	reportedIn := time.Since(canceledAt)
	require.Equal(t, id, got.ID)
	require.ErrorIs(t, got.Err, data.ErrCanceled)
	time.Sleep(time.Second) // rows still in the socket buffers would land by now
	t.Logf("after the cancel: reported in %v, %d rows copied in before, %d after the report",
		reportedIn.Round(time.Millisecond), guard.copied.Load()-copiedBefore-guard.late.Load(), guard.late.Load())
	assert.Zero(t, guard.late.Load(), "rows of the canceled transfer landed after it was reported")

	// The connections are in step: the next transfer lands whole.
	guard.slow.Store(false)
	guard.reported.Store(false)
	next, err := a.Write("b", seq(rows, rows), seq(rows, rows))
	require.NoError(t, err)
	got = nextCompletion(t, a, waitLimit)
	require.Equal(t, next, got.ID)
	require.NoError(t, got.Err)
	require.True(t, bytes.Equal(src.Mem[rows*rowLen:], dst.Mem[rows*rowLen:]), "the next transfer's rows differ")
}

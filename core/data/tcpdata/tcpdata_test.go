package tcpdata

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"io"
	"net"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/data"
)

const (
	rowLen    = 64 << 10
	sentinel  = 0xA5
	waitLimit = 10 * time.Second
)

// sentinelRegion returns rows rows filled with the sentinel byte.
func sentinelRegion(rows int) data.Region {
	r := data.Region{Mem: bytes.Repeat([]byte{sentinel}, rows*rowLen), RowLen: rowLen}
	return r
}

// randomRegion returns rows rows of random bytes.
func randomRegion(t testing.TB, rows int) data.Region {
	r := data.Region{Mem: make([]byte, rows*rowLen), RowLen: rowLen}
	_, err := rand.Read(r.Mem)
	require.NoError(t, err)
	return r
}

func newTransport(t testing.TB, id string, region data.Region, mutate func(*Options)) *Transport {
	t.Helper()
	opts := Options{
		LocalID: id, Region: region, ListenHost: "127.0.0.1",
		IOTimeout: 2 * time.Second, Logf: t.Logf,
	}
	if mutate != nil {
		mutate(&opts)
	}
	tr, err := New(opts)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

func addPeer(t testing.TB, from *Transport, peerID string, to *Transport) {
	t.Helper()
	require.NoError(t, from.AddPeer(peerID, data.PeerInfo{
		NumRows: to.region.NumRows(), RowLen: to.region.RowLen, DataAddr: to.DataAddr(),
	}))
}

func nextCompletion(t *testing.T, tr *Transport, within time.Duration) data.Completion {
	t.Helper()
	select {
	case c, ok := <-tr.Completions():
		require.True(t, ok, "completions closed")
		return c
	case <-time.After(within):
		t.Fatalf("no completion within %v", within)
		return data.Completion{}
	}
}

func seq(from, n uint64) []uint64 {
	rows := make([]uint64, n)
	for i := range rows {
		rows[i] = from + uint64(i)
	}
	return rows
}

// assertRowsAt checks dst rows against src rows and that every other dst row
// still holds the sentinel.
func assertRowsAt(t *testing.T, src, dst data.Region, srcRows, dstRows []uint64) {
	t.Helper()
	written := map[uint64]uint64{}
	for i, d := range dstRows {
		written[d] = srcRows[i]
	}
	untouched := bytes.Repeat([]byte{sentinel}, rowLen)
	for row := uint64(0); row < dst.NumRows(); row++ {
		if s, ok := written[row]; ok {
			require.True(t, bytes.Equal(src.Row(s), dst.Row(row)), "dst row %d differs from src row %d", row, s)
		} else {
			require.True(t, bytes.Equal(untouched, dst.Row(row)), "dst row %d was not named but changed", row)
		}
	}
}

func TestRowsArriveIntact(t *testing.T) {
	src := randomRegion(t, 64)
	dst := sentinelRegion(160)
	var guardMu sync.Mutex
	asked := map[string]map[uint64]bool{}
	a := newTransport(t, "a", src, nil)
	b := newTransport(t, "b", dst, func(o *Options) {
		o.Guard = data.GuardFunc(func(peerID string, row uint64) bool {
			guardMu.Lock()
			defer guardMu.Unlock()
			if asked[peerID] == nil {
				asked[peerID] = map[uint64]bool{}
			}
			asked[peerID][row] = true
			return true
		})
	})
	addPeer(t, a, "b", b)

	srcRows := seq(0, 64)
	dstRows := make([]uint64, 64)
	for i := range dstRows {
		dstRows[i] = uint64(159 - 2*i) // reversed, every other row
	}
	id, err := a.Write("b", srcRows, dstRows)
	require.NoError(t, err)
	c := nextCompletion(t, a, waitLimit)
	require.NoError(t, c.Err)
	assert.Equal(t, data.Completion{PeerID: "b", ID: id}, c)
	assertRowsAt(t, src, dst, srcRows, dstRows)

	guardMu.Lock()
	want := map[uint64]bool{}
	for _, row := range dstRows {
		want[row] = true
	}
	assert.Equal(t, map[string]map[uint64]bool{"a": want}, asked, "the guard is asked about every row, with the writer's id")
	guardMu.Unlock()
	assert.Equal(t, "tcp", a.Name())
	assert.Empty(t, a.AgentMetadata())
}

func TestOutOfRangeDestinationWritesNothing(t *testing.T) {
	src, dst := randomRegion(t, 8), sentinelRegion(8)
	a := newTransport(t, "a", src, nil)
	b := newTransport(t, "b", dst, nil)
	addPeer(t, a, "b", b)

	_, err := a.Write("b", []uint64{0, 1, 2}, []uint64{0, 8, 1})
	require.NoError(t, err)
	c := nextCompletion(t, a, waitLimit)
	require.ErrorIs(t, c.Err, data.ErrRowOutOfRange)
	assert.Contains(t, c.Err.Error(), "row 8")
	assertRowsAt(t, src, dst, nil, nil)

	// The connection stayed in step: the next transfer succeeds.
	_, err = a.Write("b", []uint64{3}, []uint64{4})
	require.NoError(t, err)
	require.NoError(t, nextCompletion(t, a, waitLimit).Err)
	assertRowsAt(t, src, dst, []uint64{3}, []uint64{4})
}

func TestGuardRejectionWritesNothing(t *testing.T) {
	src, dst := randomRegion(t, 8), sentinelRegion(8)
	a := newTransport(t, "a", src, nil)
	b := newTransport(t, "b", dst, func(o *Options) {
		o.Guard = data.GuardFunc(func(peerID string, row uint64) bool { return row != 5 })
	})
	addPeer(t, a, "b", b)

	_, err := a.Write("b", seq(0, 8), seq(0, 8))
	require.NoError(t, err)
	c := nextCompletion(t, a, waitLimit)
	require.ErrorIs(t, c.Err, data.ErrRejected)
	assert.Contains(t, c.Err.Error(), "row 5")
	assertRowsAt(t, src, dst, nil, nil)

	_, err = a.Write("b", []uint64{1}, []uint64{6})
	require.NoError(t, err)
	require.NoError(t, nextCompletion(t, a, waitLimit).Err)
	assertRowsAt(t, src, dst, []uint64{1}, []uint64{6})
}

func TestAuthSecret(t *testing.T) {
	dst := sentinelRegion(4)
	b := newTransport(t, "b", dst, func(o *Options) { o.AuthSecret = "right" })
	for _, tc := range []struct{ name, secret string }{{"wrong secret", "wrong"}, {"no secret", ""}} {
		t.Run(tc.name, func(t *testing.T) {
			a := newTransport(t, "a", randomRegion(t, 4), func(o *Options) { o.AuthSecret = tc.secret })
			addPeer(t, a, "b", b)
			_, err := a.Write("b", []uint64{0}, []uint64{0})
			require.NoError(t, err)
			c := nextCompletion(t, a, waitLimit)
			require.ErrorIs(t, c.Err, ErrAuthFailed)
			assert.Contains(t, c.Err.Error(), "did not prove the shared secret")
			assertRowsAt(t, data.Region{}, dst, nil, nil)
		})
	}
	src := randomRegion(t, 4)
	a := newTransport(t, "a", src, func(o *Options) { o.AuthSecret = "right" })
	addPeer(t, a, "b", b)
	_, err := a.Write("b", []uint64{2}, []uint64{1})
	require.NoError(t, err)
	require.NoError(t, nextCompletion(t, a, waitLimit).Err)
	assertRowsAt(t, src, dst, []uint64{2}, []uint64{1})
}

func TestRowLengthChecks(t *testing.T) {
	a := newTransport(t, "a", randomRegion(t, 4), nil)
	err := a.AddPeer("b", data.PeerInfo{RowLen: rowLen * 2, DataAddr: "127.0.0.1:1"})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "row length")

	// A peer that advertised our row length but has another is caught in
	// the hello.
	other := data.Region{Mem: make([]byte, 4*1024), RowLen: 1024}
	b := newTransport(t, "b", other, nil)
	require.NoError(t, a.AddPeer("b", data.PeerInfo{RowLen: rowLen, DataAddr: b.DataAddr()}))
	_, err = a.Write("b", []uint64{0}, []uint64{0})
	require.NoError(t, err)
	c := nextCompletion(t, a, waitLimit)
	require.ErrorIs(t, c.Err, ErrHandshake)
	assert.Contains(t, c.Err.Error(), "row length mismatch")
}

func TestWriteArgumentErrors(t *testing.T) {
	a := newTransport(t, "a", randomRegion(t, 4), nil)
	b := newTransport(t, "b", sentinelRegion(4), nil)
	_, err := a.Write("b", []uint64{0}, []uint64{0})
	assert.ErrorIs(t, err, data.ErrUnknownPeer)
	addPeer(t, a, "b", b)
	_, err = a.Write("b", []uint64{4}, []uint64{0})
	assert.ErrorIs(t, err, data.ErrRowOutOfRange)
	_, err = a.Write("b", []uint64{0, 1}, []uint64{0})
	assert.Error(t, err)

	id, err := a.Write("b", nil, nil)
	require.NoError(t, err)
	assert.Equal(t, data.Completion{PeerID: "b", ID: id}, nextCompletion(t, a, waitLimit))
}

// fakeReceiver accepts one writer, answers its hello and then hands the
// connection to behave.
func fakeReceiver(t *testing.T, behave func(net.Conn)) string {
	t.Helper()
	return acceptOne(t, func(c net.Conn) {
		var hello [serverHelloLen]byte
		binary.LittleEndian.PutUint32(hello[0:], helloMagic)
		hello[4] = protocolVersion
		var client [clientHelloLen]byte
		if _, err := c.Write(hello[:]); err != nil {
			return
		}
		if _, err := io.ReadFull(c, client[:]); err != nil {
			return
		}
		id := make([]byte, binary.LittleEndian.Uint16(client[6:]))
		if _, err := io.ReadFull(c, id); err != nil {
			return
		}
		if (helloConn{Conn: c}).writeStatus(statusOK, nil, "") != nil {
			return
		}
		behave(c)
	})
}

// acceptOne listens on loopback, hands the first connection to serve (and
// closes it after), and returns the address; the test waits for serve.
func acceptOne(t *testing.T, serve func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	done := make(chan struct{})
	t.Cleanup(func() { _ = ln.Close(); <-done })
	go func() {
		defer close(done)
		c, err := ln.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		serve(c)
	}()
	return ln.Addr().String()
}

func addFakePeer(t *testing.T, a *Transport, addr string) {
	t.Helper()
	require.NoError(t, a.AddPeer("b", data.PeerInfo{NumRows: 1 << 10, RowLen: rowLen, DataAddr: addr}))
}

func TestStalledReceiverFailsWithinIOTimeout(t *testing.T) {
	const ioTimeout = 300 * time.Millisecond
	release := make(chan struct{})
	addr := fakeReceiver(t, func(net.Conn) { <-release }) // never reads
	defer close(release)
	a := newTransport(t, "a", randomRegion(t, 512), func(o *Options) { o.IOTimeout = ioTimeout })
	addFakePeer(t, a, addr)

	start := time.Now()
	_, err := a.Write("b", seq(0, 512), seq(0, 512)) // 32 MiB, far beyond socket buffers
	require.NoError(t, err)
	c := nextCompletion(t, a, waitLimit)
	require.ErrorIs(t, c.Err, os.ErrDeadlineExceeded)
	assert.Less(t, time.Since(start), ioTimeout+2*time.Second)
}

func TestReceiverVanishingMidTransferFails(t *testing.T) {
	addr := fakeReceiver(t, func(c net.Conn) {
		_, _ = io.CopyN(io.Discard, c, 64<<10) // take some rows of the first part, then die
	})
	a := newTransport(t, "a", randomRegion(t, 512), func(o *Options) { o.IOTimeout = 500 * time.Millisecond })
	addFakePeer(t, a, addr)

	start := time.Now()
	_, err := a.Write("b", seq(0, 512), seq(0, 512))
	require.NoError(t, err)
	c := nextCompletion(t, a, waitLimit)
	require.Error(t, c.Err)
	assert.Regexp(t, "(send|ack of) transfer 1 ", c.Err.Error())
	assert.Less(t, time.Since(start), 2500*time.Millisecond)
}

func TestReconnectsAfterStalledReader(t *testing.T) {
	src, dst := randomRegion(t, 256), sentinelRegion(256)
	stall := make(chan struct{})
	var stallOnce sync.Once
	a := newTransport(t, "a", src, func(o *Options) { o.IOTimeout = 300 * time.Millisecond; o.Streams = 1 })
	b := newTransport(t, "b", dst, func(o *Options) {
		o.Guard = data.GuardFunc(func(string, uint64) bool {
			stallOnce.Do(func() { <-stall }) // the first part's guard hangs
			return true
		})
	})
	addPeer(t, a, "b", b)

	_, err := a.Write("b", seq(0, 128), seq(0, 128)) // 8 MiB
	require.NoError(t, err)
	c := nextCompletion(t, a, waitLimit)
	require.ErrorIs(t, c.Err, os.ErrDeadlineExceeded)
	close(stall)

	// Rows 0..127 may still land late from the dropped connection's
	// buffers, so the next transfer checks a row outside them.
	_, err = a.Write("b", []uint64{7}, []uint64{200})
	require.NoError(t, err)
	require.NoError(t, nextCompletion(t, a, waitLimit).Err)
	assert.Equal(t, src.Row(7), dst.Row(200))
}

func TestRemovePeerFailsPendingTransfers(t *testing.T) {
	release := make(chan struct{})
	addr := fakeReceiver(t, func(net.Conn) { <-release })
	defer close(release)
	a := newTransport(t, "a", randomRegion(t, 512), func(o *Options) { o.IOTimeout = time.Minute })
	addFakePeer(t, a, addr)

	ids := map[uint64]bool{}
	for range 3 {
		id, err := a.Write("b", seq(0, 512), seq(0, 512))
		require.NoError(t, err)
		ids[id] = true
	}
	time.Sleep(100 * time.Millisecond) // let the first part stall in the socket
	start := time.Now()
	a.RemovePeer("b")
	for range 3 {
		c := nextCompletion(t, a, waitLimit)
		require.ErrorIs(t, c.Err, data.ErrUnknownPeer)
		require.True(t, ids[c.ID], "unexpected or repeated completion %d", c.ID)
		delete(ids, c.ID)
	}
	assert.Less(t, time.Since(start), 2*time.Second)
	_, err := a.Write("b", []uint64{0}, []uint64{0})
	assert.ErrorIs(t, err, data.ErrUnknownPeer)
}

func TestCloseFailsPendingTransfers(t *testing.T) {
	release := make(chan struct{})
	addr := fakeReceiver(t, func(net.Conn) { <-release })
	defer close(release)
	a, err := New(Options{
		LocalID: "a", Region: randomRegion(t, 512), ListenHost: "127.0.0.1",
		IOTimeout: time.Minute, Logf: t.Logf,
	})
	require.NoError(t, err)
	addFakePeer(t, a, addr)
	id, err := a.Write("b", seq(0, 512), seq(0, 512))
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond)

	start := time.Now()
	require.NoError(t, a.Close())
	require.NoError(t, a.Close(), "Close is idempotent")
	assert.Less(t, time.Since(start), 2*time.Second)
	c := nextCompletion(t, a, waitLimit)
	assert.Equal(t, id, c.ID)
	assert.ErrorIs(t, c.Err, data.ErrClosed)
	_, open := <-a.Completions()
	assert.False(t, open, "completions closed after Close")
	_, err = a.Write("b", []uint64{0}, []uint64{0})
	assert.ErrorIs(t, err, data.ErrClosed)
}

func TestConcurrentTransfersCompleteOnce(t *testing.T) {
	const writers, perWriter = 4, 32
	src, dst := randomRegion(t, 8), sentinelRegion(writers*perWriter)
	a := newTransport(t, "a", src, func(o *Options) { o.Streams = 3 })
	b := newTransport(t, "b", dst, nil)
	addPeer(t, a, "b", b)

	type sent struct{ id, src, dst uint64 }
	results := make(chan sent, writers*perWriter)
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range perWriter {
				s, d := uint64(i%8), uint64(w*perWriter+i) // distinct rows: no two writes race
				id, err := a.Write("b", []uint64{s}, []uint64{d})
				assert.NoError(t, err)
				results <- sent{id, s, d}
			}
		}()
	}
	wg.Wait()
	close(results)
	byID := map[uint64]sent{}
	for r := range results {
		byID[r.id] = r
	}
	require.Len(t, byID, writers*perWriter, "ids are unique")
	var srcRows, dstRows []uint64
	for range writers * perWriter {
		c := nextCompletion(t, a, waitLimit)
		require.NoError(t, c.Err)
		r, ok := byID[c.ID]
		require.True(t, ok, "unexpected or repeated completion %d", c.ID)
		delete(byID, c.ID)
		srcRows, dstRows = append(srcRows, r.src), append(dstRows, r.dst)
	}
	select {
	case c := <-a.Completions():
		t.Fatalf("extra completion %+v", c)
	case <-time.After(100 * time.Millisecond):
	}
	assertRowsAt(t, src, dst, srcRows, dstRows)
}

func TestPanickingGuardFailsTransferNotTransport(t *testing.T) {
	src, dst := randomRegion(t, 4), sentinelRegion(4)
	a := newTransport(t, "a", src, nil)
	b := newTransport(t, "b", dst, func(o *Options) {
		o.Guard = data.GuardFunc(func(_ string, row uint64) bool {
			if row == 0 {
				panic("guard bug")
			}
			return true
		})
	})
	addPeer(t, a, "b", b)

	_, err := a.Write("b", []uint64{1}, []uint64{0})
	require.NoError(t, err)
	c := nextCompletion(t, a, waitLimit)
	require.Error(t, c.Err)
	assert.Contains(t, c.Err.Error(), "ack of transfer")

	_, err = a.Write("b", []uint64{2}, []uint64{3})
	require.NoError(t, err)
	require.NoError(t, nextCompletion(t, a, waitLimit).Err)
	assertRowsAt(t, src, dst, []uint64{2}, []uint64{3})
}

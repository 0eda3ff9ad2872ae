package tcpdata

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/data"
)

// The receiver's modes as the node runs them: a writer must prove the data
// token of its current session, alone, with the cluster secret, or with
// the secret under TLS.
var nodeModes = []struct {
	name string
	set  func(*Options)
}{
	{"default", func(o *Options) { o.RequireGrant = true }},
	{"auth_secret", func(o *Options) { o.RequireGrant, o.AuthSecret = true, secret }},
	{"encrypt", func(o *Options) { o.RequireGrant = true; encrypted(o) }},
}

// grantedWriter is a producer "a" holding b's grant for its session.
func grantedWriter(t *testing.T, b *Transport, src data.Region, mode func(*Options)) *Transport {
	t.Helper()
	var g data.Grants
	b.Grant("a", &g)
	a := newTransport(t, "a", src, mode)
	require.NoError(t, a.AddPeer("b", data.PeerInfo{NumRows: b.region.NumRows(), RowLen: b.region.RowLen,
		DataAddr: b.DataAddr(), Grants: g}))
	return a
}

// dialFrom opens a connection to addr from the loopback address ip.
func dialFrom(t *testing.T, ip, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: waitLimit}
	c, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	return c
}

// Connections that never finish their hello, from the writer's own address
// or from many, cannot lock a writer out, in any mode: they do not count
// against the writers' bounds, and the oldest of them gives way.
func TestIdleHellosDoNotLockOutWriters(t *testing.T) {
	for _, mode := range nodeModes {
		for _, attack := range []struct {
			name           string
			hosts, perHost int
		}{
			{"64 from the writer's address", 1, 64},
			{"1024 from 16 addresses", 16, 64},
		} {
			t.Run(mode.name+"/"+attack.name, func(t *testing.T) {
				src, dst := randomRegion(t, 4), sentinelRegion(4)
				// IOTimeout at its default: on the old code the idle
				// connections held their places that long.
				b := newTransport(t, "b", dst, func(o *Options) { mode.set(o); o.IOTimeout = DefaultIOTimeout })
				var idle []net.Conn
				defer func() {
					for _, c := range idle {
						_ = c.Close()
					}
				}()
				for h := range attack.hosts {
					for range attack.perHost {
						idle = append(idle, dialFrom(t, fmt.Sprintf("127.0.0.%d", 1+h), b.DataAddr()))
					}
				}
				// Each was accepted (it got the receiver's first bytes) or
				// closed, before the writer dials.
				for _, c := range idle {
					_ = c.SetReadDeadline(time.Now().Add(waitLimit))
					_, _ = io.ReadFull(c, make([]byte, serverHelloLen))
				}

				a := grantedWriter(t, b, src, mode.set)
				_, err := a.Write("b", []uint64{1}, []uint64{2})
				require.NoError(t, err)
				require.NoError(t, nextCompletion(t, a, waitLimit).Err, "the writer got in")
				assertRowsAt(t, src, dst, []uint64{1}, []uint64{2})
			})
		}
	}
}

// helloAsWriter runs a plaintext hello on c as peerID proving token, the
// way a producer does, and fails the test unless the receiver accepts it.
func helloAsWriter(t *testing.T, c net.Conn, peerID, token string, rowLen uint64) {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(waitLimit))
	server := make([]byte, serverHelloLen)
	_, err := io.ReadFull(c, server)
	require.NoError(t, err)
	msg := make([]byte, clientHelloLen+len(peerID))
	binary.LittleEndian.PutUint32(msg[0:], helloMagic)
	msg[4] = protocolVersion
	binary.LittleEndian.PutUint16(msg[6:], uint16(len(peerID)))
	binary.LittleEndian.PutUint64(msg[8:], rowLen)
	copy(msg[16:], helloMAC(writerKey("", token), server[8:], rowLen, peerID))
	copy(msg[clientHelloLen:], peerID)
	_, err = c.Write(msg)
	require.NoError(t, err)
	st := make([]byte, helloStatusLen)
	_, err = io.ReadFull(c, st)
	require.NoError(t, err)
	require.Equal(t, byte(statusOK), st[0], "hello refused")
	_ = c.SetDeadline(time.Time{})
}

// owesRows lets peer "a" write rows below owed, and says so.
type owesRows struct{ owed uint64 }

func (g owesRows) MayWrite(peerID string, row uint64) bool { return peerID == "a" && row < g.owed }
func (g owesRows) WriteRow(peerID string, row uint64, dst, src []byte) bool {
	return data.GuardFunc(g.MayWrite).WriteRow(peerID, row, dst, src)
}
func (g owesRows) RowsOwed(peerID string) int {
	if peerID == "a" {
		return int(g.owed)
	}
	return 0
}

func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// A writer holding a token, owed 4 rows, that names every row of a 2^20-row
// region in part headers on several connections does not make the receiver
// allocate by the region's size, and what it did hold is returned when the
// connections close.
func TestPartHeadersDoNotAllocateByRegionSize(t *testing.T) {
	const (
		regionRows = 1 << 20
		smallRow   = 16
		conns      = 8 // 16 MiB each on the old receiver
		bound      = 32 << 20
	)
	dst := data.Region{Mem: make([]byte, regionRows*smallRow), RowLen: smallRow}
	b := newTransport(t, "b", dst, func(o *Options) {
		o.RequireGrant, o.Guard, o.IOTimeout = true, owesRows{owed: 4}, DefaultIOTimeout
	})
	var g data.Grants
	b.Grant("a", &g)

	// One part: names row 0 regionRows times, carries one row.
	part := make([]byte, partHeaderLen+regionRows*rowIndexLen+smallRow)
	partHeader{partRows: 1, transferID: 7, rowLen: smallRow, totalRows: regionRows}.put(part)
	before := heapInUse()

	var open []net.Conn
	defer func() {
		for _, c := range open {
			_ = c.Close()
		}
	}()
	for range conns {
		c, err := net.Dial("tcp", b.DataAddr())
		require.NoError(t, err)
		open = append(open, c)
		helloAsWriter(t, c, "a", g.DataToken, smallRow)
		_ = c.SetDeadline(time.Now().Add(waitLimit))
		_, err = c.Write(part)
		require.NoError(t, err)
		reply := make([]byte, ackLen)
		_, err = io.ReadFull(c, reply)
		require.NoError(t, err, "the receiver answers the part")
	}
	held := heapInUse() - before
	t.Logf("heap held with %d connections open: %d MiB", conns, held>>20)
	assert.Less(t, held, int64(bound), "held by region size, not by the 4 rows owed")

	for _, c := range open {
		_ = c.Close()
	}
	open = nil
	require.Eventually(t, func() bool { return heapInUse()-before < bound }, waitLimit, 50*time.Millisecond,
		"not returned after the connections closed")
}

// What the receiver holds for parts in flight is bounded by MaxHeldBytes:
// a part that finds no room waits half an IOTimeout and is refused as busy,
// a part naming more rows than the writer is owed is refused before it
// takes any, and all of it is given back when the connections close.
func TestHeldBytesAreBoundedAndReturned(t *testing.T) {
	const owed = 64
	dst := sentinelRegion(2 * owed)
	b := newTransport(t, "b", dst, func(o *Options) {
		o.RequireGrant, o.Guard, o.IOTimeout = true, owesRows{owed: owed}, 6*time.Second
		o.MaxHeldBytes = 1 // raised to two of the largest parts
	})
	onePart := partBytes(owed, rowLen, true)
	require.Equal(t, 2*largestPartBytes(dst), b.held.limit, "room for two parts of 64 rows, not three")
	var g data.Grants
	b.Grant("a", &g)

	header := func(totalRows uint32) []byte {
		p := make([]byte, partHeaderLen+int(totalRows)*rowIndexLen)
		partHeader{partRows: totalRows, transferID: 1, rowLen: rowLen, totalRows: totalRows}.put(p)
		for i := range totalRows {
			binary.LittleEndian.PutUint64(p[partHeaderLen+int(i)*rowIndexLen:], uint64(i%owed))
		}
		return p
	}
	var open []net.Conn
	defer func() {
		for _, c := range open {
			_ = c.Close()
		}
	}()
	stall := func(p []byte) net.Conn { // sends p: a part's header and maybe rows
		c, err := net.Dial("tcp", b.DataAddr())
		require.NoError(t, err)
		open = append(open, c)
		helloAsWriter(t, c, "a", g.DataToken, rowLen)
		_, err = c.Write(p)
		require.NoError(t, err)
		return c
	}
	readAck := func(c net.Conn) ack {
		_ = c.SetReadDeadline(time.Now().Add(waitLimit))
		buf := make([]byte, ackLen)
		_, err := io.ReadFull(c, buf)
		require.NoError(t, err)
		return parseAck(buf)
	}

	stall(header(owed))
	stall(header(owed))
	require.Eventually(t, func() bool { return b.InboundStats().HeldBytes == 2*onePart }, waitLimit, 10*time.Millisecond)
	notOwed := append(header(owed+1), make([]byte, (owed+1)*rowLen)...) // its rows too, read and dropped
	assert.Equal(t, statusNotOwed, readAck(stall(notOwed)).status, "refused, holding nothing")
	busy := append(header(owed), make([]byte, owed*rowLen)...)
	assert.Equal(t, statusBusy, readAck(stall(busy)).status, "no room while two parts stall")
	st := b.InboundStats()
	assert.LessOrEqual(t, st.HeldBytes, b.held.limit)
	assert.EqualValues(t, 1, st.PartsNotOwed)
	assert.EqualValues(t, 1, st.PartsNoRoom)

	for _, c := range open {
		_ = c.Close()
	}
	require.Eventually(t, func() bool { return b.InboundStats().HeldBytes == 0 }, waitLimit, 10*time.Millisecond,
		"returned when the connections close")
}

// A plaintext connection that never sends its hello is closed within the
// hello deadline (3 s), not the I/O timeout (10 s).
func TestPlaintextHelloHasDeadline(t *testing.T) {
	b := newTransport(t, "b", sentinelRegion(4), func(o *Options) { o.RequireGrant, o.IOTimeout = true, DefaultIOTimeout })
	c, err := net.Dial("tcp", b.DataAddr())
	require.NoError(t, err)
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(waitLimit))
	_, err = io.ReadFull(c, make([]byte, serverHelloLen))
	require.NoError(t, err)
	start := time.Now()
	_, err = c.Read(make([]byte, 1))
	require.ErrorIs(t, err, io.EOF, "the receiver hangs up")
	assert.Less(t, time.Since(start), DefaultHelloTimeout+2*time.Second)
}

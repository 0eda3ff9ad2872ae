package tcpdata

import (
	"encoding/binary"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/data"
)

// tryHello runs a plaintext hello on a new connection to addr as peerID
// proving token, and returns the connection with the receiver's status and
// reason.
func tryHello(t *testing.T, addr, peerID, token string) (net.Conn, status, string) {
	t.Helper()
	c := dialFrom(t, "127.0.0.1", addr)
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
	reason := make([]byte, binary.LittleEndian.Uint16(st[2:]))
	_, _ = io.ReadFull(c, reason)
	_ = c.SetDeadline(time.Time{})
	return c, status(st[0]), string(reason)
}

// notOwedPart is a whole one-row part: a writer owed nothing has it
// refused, read to its end and acked.
func notOwedPart() []byte {
	p := make([]byte, partHeaderLen+rowIndexLen+rowLen)
	partHeader{partRows: 1, transferID: 9, rowLen: rowLen, totalRows: 1}.put(p)
	return p
}

// sendNotOwed sends a not-owed part on c and reads its ack; false when the
// receiver closed c.
func sendNotOwed(c net.Conn) bool {
	_ = c.SetDeadline(time.Now().Add(waitLimit))
	if _, err := c.Write(notOwedPart()); err != nil {
		return false
	}
	reply := make([]byte, ackLen)
	if _, err := io.ReadFull(c, reply); err != nil {
		return false
	}
	return parseAck(reply).status == statusNotOwed
}

// A stranger holding valid tokens (any peer that connects gets one) fills
// the proven connections of the writer's IP and keeps them open with part
// headers it is not owed: it holds at most connsPerStream × Streams
// connections per token, and a writer from the same IP with rows owed
// still writes, in place of a connection owed nothing.
func TestStrangersOwedNothingCannotHoldAWritersPlaces(t *testing.T) {
	const perHost = 12
	src, dst := randomRegion(t, 4), sentinelRegion(4)
	b := newTransport(t, "b", dst, func(o *Options) {
		// IOTimeout at its default: the stranger's connections are not cut
		// for being owed nothing before the writer comes.
		o.RequireGrant, o.Guard, o.MaxConnsPerHost, o.IOTimeout = true, owesRows{owed: 4}, perHost, DefaultIOTimeout
	})
	perPeer := connsPerStream * b.opts.Streams
	var gx, gy data.Grants
	b.Grant("x", &gx)
	b.Grant("y", &gy)

	var mu sync.Mutex
	var held []net.Conn
	defer func() {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range held {
			_ = c.Close()
		}
	}()
	open := func(peerID, token string) (status, string) {
		c, st, why := tryHello(t, b.DataAddr(), peerID, token)
		mu.Lock()
		held = append(held, c)
		mu.Unlock()
		return st, why
	}
	for i := range perPeer {
		st, why := open("x", gx.DataToken)
		require.Equal(t, statusOK, st, "x's connection %d: %s", i+1, why)
	}
	st, why := open("x", gx.DataToken)
	require.Equal(t, statusBusy, st, "one token holds at most %d connections", perPeer)
	assert.Contains(t, why, "data connections of x already")
	for i := range perHost - perPeer {
		st, why := open("y", gy.DataToken)
		require.Equal(t, statusOK, st, "y's connection %d: %s", i+1, why)
	}
	require.Equal(t, perHost, b.InboundStats().Conns, "the stranger holds every place of the IP")

	// The stranger keeps every connection busy with parts it is not owed.
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		mu.Lock()
		conns := append([]net.Conn(nil), held...)
		mu.Unlock()
		alive := map[net.Conn]bool{}
		for _, c := range conns {
			alive[c] = true
		}
		for {
			for c := range alive {
				if !sendNotOwed(c) {
					delete(alive, c)
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	time.Sleep(2 * b.admit.provenGrace) // its connections are idle past the grace, busy with refused parts

	a := grantedWriter(t, b, src, func(o *Options) { o.RequireGrant = true })
	_, err := a.Write("b", []uint64{1}, []uint64{2})
	require.NoError(t, err)
	require.NoError(t, nextCompletion(t, a, waitLimit).Err, "the writer owed rows gets in")
	assertRowsAt(t, src, dst, []uint64{1}, []uint64{2})
	st2 := b.InboundStats()
	assert.GreaterOrEqual(t, st2.ProvenEvicted, uint64(1), "a stranger's connection owed nothing gave way")
	assert.LessOrEqual(t, st2.Conns, perHost)
}

// Parts a writer is not owed do not keep its connection: one owed nothing
// that keeps sending them is closed about one IOTimeout after the first,
// not kept for the idle deadline (2 × IdleTimeout + IOTimeout).
func TestPartsNotOwedDoNotKeepAConnection(t *testing.T) {
	const ioTimeout = time.Second
	b := newTransport(t, "b", sentinelRegion(4), func(o *Options) {
		o.RequireGrant, o.Guard, o.IOTimeout = true, owesRows{owed: 4}, ioTimeout
	})
	var gx data.Grants
	b.Grant("x", &gx)
	c, st, why := tryHello(t, b.DataAddr(), "x", gx.DataToken)
	defer c.Close()
	require.Equal(t, statusOK, st, why)

	start := time.Now()
	for sendNotOwed(c) {
		require.Less(t, time.Since(start), waitLimit, "still open: refused parts renew its deadline")
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("closed %v after the first part not owed", time.Since(start).Round(time.Millisecond))
	assert.GreaterOrEqual(t, time.Since(start), ioTimeout/2, "not at the first refused part")
	require.Eventually(t, func() bool { return b.InboundStats().Conns == 0 }, waitLimit, 10*time.Millisecond)
	assert.EqualValues(t, 1, b.InboundStats().OwedNothing)

}

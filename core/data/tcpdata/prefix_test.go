package tcpdata

import (
	"crypto/tls"
	"encoding/binary"
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// genuineHelloStart is the start of what a real writer sends first in a
// mode: the fixed part of the plaintext client hello, or (encrypted) the
// TLS ClientHello record a real TLS client writes.
func genuineHelloStart(t *testing.T, encrypted bool) []byte {
	t.Helper()
	if !encrypted {
		b := make([]byte, clientHelloLen)
		binary.LittleEndian.PutUint32(b[0:], helloMagic)
		b[4] = protocolVersion
		binary.LittleEndian.PutUint16(b[6:], 1)
		binary.LittleEndian.PutUint64(b[8:], rowLen)
		return b
	}
	ours, theirs := net.Pipe()
	defer func() { _ = ours.Close(); _ = theirs.Close() }()
	go func() {
		_ = tls.Client(theirs, &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}).Handshake()
	}()
	var hdr [5]byte
	_, err := io.ReadFull(ours, hdr[:])
	require.NoError(t, err)
	rec := make([]byte, 5+int(binary.BigEndian.Uint16(hdr[3:])))
	copy(rec, hdr[:])
	_, err = io.ReadFull(ours, rec[5:])
	require.NoError(t, err)
	return rec
}

// helloPrefixes runs n strangers from ip that each dial addr, read the
// receiver's first bytes, send a prefix of start (never all of it), hold
// the connection for up to hold and dial again, until the returned stop.
func helloPrefixes(t *testing.T, ip, addr string, start []byte, n int, hold time.Duration) (stop func()) {
	t.Helper()
	halt := make(chan struct{})
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: time.Second}
			for {
				select {
				case <-halt:
					return
				default:
				}
				c, err := d.Dial("tcp", addr)
				if err != nil {
					time.Sleep(time.Millisecond)
					continue
				}
				_ = c.SetDeadline(time.Now().Add(hold))
				if _, err := io.ReadFull(c, make([]byte, serverHelloLen)); err == nil {
					if _, err := c.Write(start[:1+rand.IntN(len(start)-1)]); err == nil {
						_, _ = c.Read(make([]byte, 1)) // until closed, or hold has passed
					}
				}
				_ = c.Close()
			}
		}()
	}
	var once sync.Once
	stop = func() { once.Do(func() { close(halt); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

// Strangers on the writer's own address that redial, each sending the
// start of a genuine hello (in encrypt mode, of a genuine TLS ClientHello)
// and never the rest, keep the hello budget of that address full of young
// connections that look like writers mid-hello. A writer sends each
// message of its hello whole, so they give way to it: in every mode every
// write on a fresh connection succeeds.
func TestHelloPrefixesFromTheWritersAddressDoNotLockItOut(t *testing.T) {
	const writes = 8
	for _, mode := range nodeModes {
		t.Run(mode.name, func(t *testing.T) {
			src, dst := randomRegion(t, writes), sentinelRegion(writes)
			// The default deadlines: a hello under this attack on a loaded
			// host (race detector on) can take a second.
			set := func(o *Options) { mode.set(o); o.IOTimeout = 4 * time.Second }
			b := newTransport(t, "b", dst, set)
			// Twice the per-address budget, each redialled as soon as it is
			// closed (or after a second): the budget stays full of young
			// connections that sent the start of a hello.
			stop := helloPrefixes(t, "127.0.0.1", b.DataAddr(), genuineHelloStart(t, b.tls != nil),
				2*b.opts.MaxHelloConnsPerHost, time.Second)
			defer stop()
			require.Eventually(t, func() bool { return b.InboundStats().HelloEvicted >= 64 }, waitLimit,
				10*time.Millisecond, "the strangers churn the hello budget of the writer's address")

			for i := range uint64(writes) {
				a := grantedWriter(t, b, src, set) // a fresh producer: a new connection, a new hello
				_, err := a.Write("b", []uint64{i}, []uint64{i})
				require.NoError(t, err)
				require.NoError(t, nextCompletion(t, a, waitLimit).Err, "write %d of %d", i+1, writes)
				require.NoError(t, a.Close())
			}
			stop()
			assertRowsAt(t, src, dst, seq(0, writes), seq(0, writes))
			st := b.InboundStats()
			t.Logf("%s: %d connections closed in their hello for newer ones", mode.name, st.HelloEvicted)
		})
	}
}

// A writer's TLS hello sends its ClientHello whole and then waits on its
// own round trip. Strangers that dialled after it and have sent nothing
// have waited less for their first bytes than it has for its next, yet
// they give way first: a newcomer closes the silent ones, not the writer
// mid-handshake.
func TestAWriterMidHandshakeOutlastsSilentStrangers(t *testing.T) {
	tr := newTransport(t, "b", sentinelRegion(4), func(o *Options) {
		encrypted(o)
		o.MaxHelloConns, o.MaxHelloConnsPerHost = 8, 3
		o.IOTimeout, o.HelloTimeout = time.Minute, time.Minute // only a newcomer closes a hello here
	})
	const ip = "127.0.0.1"
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	// dial opens a connection from ip, reads the clear server hello, sends
	// first and waits until the receiver read it and waits for more.
	dial := func(first []byte) net.Conn {
		c := dialFrom(t, ip, tr.DataAddr())
		conns = append(conns, c)
		_ = c.SetReadDeadline(time.Now().Add(waitLimit))
		_, err := io.ReadFull(c, make([]byte, serverHelloLen))
		require.NoError(t, err, "every newcomer gets in: it gets the server hello")
		if len(first) > 0 {
			_, err = c.Write(first)
			require.NoError(t, err)
		}
		require.Eventually(t, func() bool {
			tr.mu.Lock()
			defer tr.mu.Unlock()
			for _, in := range tr.inbound {
				if in.conn.RemoteAddr().String() == c.LocalAddr().String() {
					return in.bytesIn.Load() == int64(len(first)) && in.owesFor(time.Now()) > 0
				}
			}
			return false
		}, waitLimit, time.Millisecond)
		return c
	}
	isClosed := func(c net.Conn) bool {
		_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		_, err := io.Copy(io.Discard, c) // the server's TLS flight, then EOF once closed
		return err == nil
	}

	writer := dial(genuineHelloStart(t, true)) // its ClientHello whole; it owes its Finished
	silent1, silent2 := dial(nil), dial(nil)
	dial(nil)
	require.Eventually(t, func() bool { return isClosed(silent1) }, waitLimit, time.Millisecond,
		"the silent stranger gave way, though it has waited less than the writer")
	dial(nil)
	require.Eventually(t, func() bool { return isClosed(silent2) }, waitLimit, time.Millisecond,
		"then the next silent one")
	assert.False(t, isClosed(writer), "the writer mid-handshake is still in its hello")
	assert.EqualValues(t, 2, tr.InboundStats().HelloEvicted)
}

// A connection that sent its hello's messages whole and waits on its own
// round trip is never closed while one from its IP has not been served
// yet (that one may be a stranger's): the newcomer is refused instead.
// Once every one is served, the writer is chosen only when no stranger is
// stopped mid-message or silent.
func TestAWriterMidHandshakeIsNotClosedForAnUnservedConnection(t *testing.T) {
	now := time.Now()
	conn := func() *inboundConn {
		ours, theirs := net.Pipe()
		t.Cleanup(func() { _ = ours.Close(); _ = theirs.Close() })
		return &inboundConn{conn: ours, host: "127.0.0.1", served: make(chan struct{})}
	}
	writer, unserved := conn(), conn()
	writer.isServed.Store(true)
	writer.shaped.Store(6)
	writer.bytesIn.Store(1400)                                            // its ClientHello, whole
	writer.waitingSince.Store(now.Add(-50 * time.Millisecond).UnixNano()) // for its Finished
	hello := []*inboundConn{writer, unserved}
	all := func(*inboundConn) bool { return true }
	assert.Equal(t, -1, evictionCandidate(hello, all, now), "refused: the other was not served yet")

	unserved.isServed.Store(true)
	unserved.waitingSince.Store(now.Add(-time.Millisecond).UnixNano())
	assert.Equal(t, 1, evictionCandidate(hello, all, now), "served and silent, it gives way first")
}

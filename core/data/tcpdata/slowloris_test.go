package tcpdata

import (
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// slowloris holds n connections to addr from ip that never send a byte,
// redialling each the moment the receiver closes it, until the returned
// stop is called.
func slowloris(t *testing.T, ip, addr string, n int) (stop func()) {
	t.Helper()
	halt := make(chan struct{})
	var mu sync.Mutex
	held := map[net.Conn]bool{}
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
				mu.Lock()
				select {
				case <-halt: // stop has closed what it held
					mu.Unlock()
					_ = c.Close()
					return
				default:
				}
				held[c] = true
				mu.Unlock()
				_, _ = io.Copy(io.Discard, c) // until the receiver (or stop) closes it
				mu.Lock()
				delete(held, c)
				mu.Unlock()
				_ = c.Close()
			}
		}()
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			close(halt)
			mu.Lock()
			for c := range held {
				_ = c.Close()
			}
			mu.Unlock()
			wg.Wait()
		})
	}
	t.Cleanup(stop)
	return stop
}

// A slowloris from the writer's own address (64 connections that never
// send a byte, each redialled as soon as it is closed) cannot evict a
// writer's connection while its hello, TLS handshake included, is under
// way: in every mode, every write on a fresh connection succeeds.
func TestASlowlorisFromTheWritersAddressCannotEvictItsHello(t *testing.T) {
	const writes = 8
	for _, mode := range nodeModes {
		t.Run(mode.name, func(t *testing.T) {
			src, dst := randomRegion(t, writes), sentinelRegion(writes)
			b := newTransport(t, "b", dst, mode.set)
			stop := slowloris(t, "127.0.0.1", b.DataAddr(), 64)
			defer stop()
			require.Eventually(t, func() bool { return b.InboundStats().HelloEvicted >= 64 }, waitLimit,
				10*time.Millisecond, "the slowloris churns the hello budget")

			for i := range uint64(writes) {
				a := grantedWriter(t, b, src, mode.set) // a fresh producer: a new connection, a new hello
				_, err := a.Write("b", []uint64{i}, []uint64{i})
				require.NoError(t, err)
				require.NoError(t, nextCompletion(t, a, waitLimit).Err, "write %d of %d", i+1, writes)
				require.NoError(t, a.Close())
			}
			stop()
			assertRowsAt(t, src, dst, seq(0, writes), seq(0, writes))
			st := b.InboundStats()
			t.Logf("%s: %d connections closed in their hello for newer ones, %d newcomers refused", mode.name,
				st.HelloEvicted, st.HelloRefused)
		})
	}
}

// When the hello budget of an address is full, a newcomer closes the
// connection that made the least progress: one whose bytes do not start a
// hello first, then one that never sent a byte, even if it is not the
// oldest; while every connection has sent the start of a hello and is
// within the grace, the newcomer is refused instead; past the grace, the
// one that sent the fewest bytes gives way.
func TestHellosGiveWayByProgress(t *testing.T) {
	tr := newTransport(t, "b", sentinelRegion(4), func(o *Options) {
		o.MaxHelloConns, o.MaxHelloConnsPerHost, o.IOTimeout = 16, 3, DefaultIOTimeout
	})
	setGrace := func(d time.Duration) { tr.mu.Lock(); tr.admit.grace = d; tr.mu.Unlock() }
	setGrace(time.Hour) // every connection is young until said otherwise
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	// A client hello's start, the magic and version, then its pad and id
	// length.
	start := []byte{'P', 'K', 'V', 'D', protocolVersion, 0, 1, 0}
	// dial opens a connection, reads the server hello and sends the first n
	// bytes of a client hello.
	dial := func(n int) net.Conn {
		c := dialFrom(t, "127.0.0.1", tr.DataAddr())
		conns = append(conns, c)
		_ = c.SetReadDeadline(time.Now().Add(waitLimit))
		_, err := io.ReadFull(c, make([]byte, serverHelloLen))
		require.NoError(t, err, "every newcomer that gets in gets the server hello")
		if n > 0 {
			_, err = c.Write(start[:n])
			require.NoError(t, err)
		}
		return c
	}
	isClosed := func(c net.Conn) bool {
		_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
		_, err := c.Read(make([]byte, 1))
		return err != nil && !strings.Contains(err.Error(), "timeout")
	}
	waitClosed := func(c net.Conn, what string) {
		t.Helper()
		require.Eventually(t, func() bool { return isClosed(c) }, waitLimit, time.Millisecond, what)
	}

	a, silent, partial := dial(8), dial(0), dial(3)
	d := dial(0)
	waitClosed(partial, "the one whose bytes do not start a hello yet gave way before the one that sent nothing")
	c := dial(5)
	waitClosed(silent, "the one that sent nothing gave way, though it is not the oldest")
	e := dial(6)
	waitClosed(d, "then the newest, which sent nothing either")
	for _, o := range []net.Conn{a, c, e} {
		assert.False(t, isClosed(o), "a young connection that sent the start of a hello stays")
	}

	// Every hello is young and under way: the newcomer is refused.
	f := dialFrom(t, "127.0.0.1", tr.DataAddr())
	conns = append(conns, f)
	_ = f.SetReadDeadline(time.Now().Add(waitLimit))
	_, err := f.Read(make([]byte, 1))
	require.Error(t, err, "refused without a server hello")
	st := tr.InboundStats()
	assert.EqualValues(t, 3, st.HelloEvicted)
	assert.EqualValues(t, 1, st.HelloRefused)

	// Past the grace, the one that sent the fewest bytes gives way.
	setGrace(0)
	dial(0)
	waitClosed(c, "c sent 5 bytes, a 8 and e 6")
	assert.False(t, isClosed(a))
	assert.False(t, isClosed(e))
}

// Connections that each sent one stray byte, not the start of a hello, and
// are always younger than the grace (an attacker redialling each faster
// than that), fill the hello budget of the writer's address: they are not
// progress toward a hello, so in every mode the writer's connection takes
// the place of one of them.
func TestStrayBytesDoNotCountAsHelloProgress(t *testing.T) {
	for _, mode := range nodeModes {
		t.Run(mode.name, func(t *testing.T) {
			src, dst := randomRegion(t, 4), sentinelRegion(4)
			b := newTransport(t, "b", dst, func(o *Options) { mode.set(o); o.HelloTimeout = waitLimit })
			b.mu.Lock()
			b.admit.grace = time.Hour // every connection is young, as if redialled before the grace
			b.mu.Unlock()
			var stray []net.Conn
			defer func() {
				for _, c := range stray {
					_ = c.Close()
				}
			}()
			for range b.opts.MaxHelloConnsPerHost {
				c := dialFrom(t, "127.0.0.1", b.DataAddr())
				stray = append(stray, c)
				_ = c.SetReadDeadline(time.Now().Add(waitLimit))
				_, err := io.ReadFull(c, make([]byte, 8))
				require.NoError(t, err, "accepted: it got the server hello")
				_, err = c.Write([]byte{0xff})
				require.NoError(t, err)
			}
			require.Equal(t, b.opts.MaxHelloConnsPerHost, b.InboundStats().HelloConns)

			a := grantedWriter(t, b, src, mode.set)
			_, err := a.Write("b", []uint64{1}, []uint64{2})
			require.NoError(t, err)
			require.NoError(t, nextCompletion(t, a, waitLimit).Err, "the writer got in")
			assertRowsAt(t, src, dst, []uint64{1}, []uint64{2})
			assert.GreaterOrEqual(t, b.InboundStats().HelloEvicted, uint64(1), "a stray connection gave way")
		})
	}
}

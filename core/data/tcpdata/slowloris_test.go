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
			t.Logf("%s: %d connections closed in their hello for newer ones", mode.name, st.HelloEvicted)
		})
	}
}

// When a hello budget is full, a newcomer is always let in and closes the
// connection furthest from finishing a hello as a writer does, even if it
// is not the oldest: one whose bytes do not start a hello first, then one
// stopped mid-hello, then the one that has owed us bytes longest. Beyond
// the total budget the connection closed is from the address holding the
// most.
func TestHellosGiveWayByProgress(t *testing.T) {
	tr := newTransport(t, "b", sentinelRegion(4), func(o *Options) {
		o.MaxHelloConns, o.MaxHelloConnsPerHost = 4, 3
		o.IOTimeout, o.HelloTimeout = time.Minute, time.Minute // only a newcomer closes a hello here
	})
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	// dial opens a connection from ip, reads the server hello and sends
	// first.
	dial := func(ip string, first ...byte) net.Conn {
		c := dialFrom(t, ip, tr.DataAddr())
		conns = append(conns, c)
		_ = c.SetReadDeadline(time.Now().Add(waitLimit))
		_, err := io.ReadFull(c, make([]byte, serverHelloLen))
		require.NoError(t, err, "every newcomer gets in: it gets the server hello")
		if len(first) > 0 {
			_, err = c.Write(first)
			require.NoError(t, err)
		}
		// Served, and what it sent read, before the next dial.
		require.Eventually(t, func() bool {
			tr.mu.Lock()
			defer tr.mu.Unlock()
			for _, in := range tr.inbound {
				if in.conn.RemoteAddr().String() == c.LocalAddr().String() {
					return in.isServed.Load() && in.bytesIn.Load() == int64(len(first))
				}
			}
			return false
		}, waitLimit, time.Millisecond)
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
	const ip = "127.0.0.1"
	// The magic and version of a client hello, never the rest.
	start := []byte{'P', 'K', 'V', 'D', protocolVersion}

	silent, stopped, stray := dial(ip), dial(ip, start...), dial(ip, 0xff)
	d := dial(ip)
	waitClosed(stray, "the one whose bytes do not start a hello gave way first, though the newest")
	e := dial(ip)
	waitClosed(stopped, "then the one stopped mid-hello, though the one that sent nothing is older")
	f := dial(ip)
	waitClosed(silent, "then the one that owed its hello longest")
	for _, o := range []net.Conn{d, e, f} {
		assert.False(t, isClosed(o))
	}

	// The total budget (4) is full with a stray one from another address:
	// a third address's newcomer closes one from the address holding the
	// most, not the stray one.
	other := dial("127.0.0.2", 0xff)
	dial("127.0.0.3")
	waitClosed(d, "the longest owing of the address holding the most gave way")
	assert.False(t, isClosed(other))
	assert.EqualValues(t, 4, tr.InboundStats().HelloEvicted)
}

// Connections that each sent one stray byte, not the start of a hello,
// fill the hello budget of the writer's address: they are not progress
// toward a hello, so in every mode the writer's connection takes the place
// of one of them.
func TestStrayBytesDoNotCountAsHelloProgress(t *testing.T) {
	for _, mode := range nodeModes {
		t.Run(mode.name, func(t *testing.T) {
			src, dst := randomRegion(t, 4), sentinelRegion(4)
			b := newTransport(t, "b", dst, func(o *Options) { mode.set(o); o.HelloTimeout = waitLimit })
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

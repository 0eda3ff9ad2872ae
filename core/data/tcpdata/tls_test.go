package tcpdata

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/data"
)

const secret = "cluster secret"

func encrypted(o *Options) { o.AuthSecret, o.Encrypt = secret, true }

// logTap collects a transport's log lines so a test can wait for one.
type logTap struct {
	mu    sync.Mutex
	lines []string
}

func (l *logTap) logf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

// count is how many lines logged so far contain want.
func (l *logTap) count(want string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, line := range l.lines {
		if strings.Contains(line, want) {
			n++
		}
	}
	return n
}

// waitFor fails the test unless a line containing want is logged in time.
func (l *logTap) waitFor(t *testing.T, want string) {
	t.Helper()
	require.Eventually(t, func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		for _, line := range l.lines {
			if strings.Contains(line, want) {
				return true
			}
		}
		return false
	}, waitLimit, 10*time.Millisecond, "no log line containing %q", want)
}

// proxy accepts connections and hands each, with a fresh connection to
// target, to relay; it returns its address. Cleanup closes everything.
func proxy(t *testing.T, target string, relay func(client, server net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
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
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				_ = client.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, client, server)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer client.Close()
				defer server.Close()
				relay(client, server)
			}()
		}
	}()
	return ln.Addr().String()
}

// pipe copies both ways until either side ends; sniff, when set, receives
// a copy of what the client sends.
func pipe(client, server net.Conn, sniff io.Writer) {
	done := make(chan struct{}, 2)
	up := io.Writer(server)
	if sniff != nil {
		up = io.MultiWriter(server, sniff)
	}
	go func() { _, _ = io.Copy(up, client); done <- struct{}{} }()
	go func() { _, _ = io.Copy(client, server); done <- struct{}{} }()
	<-done
	_ = client.Close()
	_ = server.Close()
	<-done
}

// lockedBuffer is a bytes.Buffer safe for a relay goroutine and the test.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) contains(p []byte) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return bytes.Contains(l.b.Bytes(), p)
}

func (l *lockedBuffer) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Len()
}

func TestEncryptedRowsArriveIntactAndUnreadable(t *testing.T) {
	for _, tc := range []struct {
		name    string
		encrypt bool
	}{{"plaintext", false}, {"TLS", true}} {
		t.Run(tc.name, func(t *testing.T) {
			mode := func(o *Options) { o.AuthSecret, o.Encrypt = secret, tc.encrypt }
			src, dst := randomRegion(t, 64), sentinelRegion(160)
			var wire lockedBuffer
			a := newTransport(t, "a", src, mode)
			b := newTransport(t, "b", dst, mode)
			addr := proxy(t, b.DataAddr(), func(c, s net.Conn) { pipe(c, s, &wire) })
			require.NoError(t, a.AddPeer("b", data.PeerInfo{NumRows: 160, RowLen: rowLen, DataAddr: addr}))

			srcRows, dstRows := seq(0, 64), seq(90, 64)
			for range 2 { // the second transfer reuses the connections
				id, err := a.Write("b", srcRows, dstRows)
				require.NoError(t, err)
				assert.Equal(t, data.Completion{PeerID: "b", ID: id}, nextCompletion(t, a, waitLimit))
			}
			assertRowsAt(t, src, dst, srcRows, dstRows)
			require.Greater(t, wire.len(), 64*rowLen)
			// 32 random bytes of a row appear on the wire only in the clear.
			assert.Equal(t, !tc.encrypt, wire.contains(src.Row(17)[1000:1032]), "row bytes visible on the wire")
		})
	}
}

func TestEncryptNeedsSecret(t *testing.T) {
	_, err := New(Options{LocalID: "a", Region: randomRegion(t, 1), ListenHost: "127.0.0.1", Encrypt: true})
	require.Error(t, err)
	assert.Contains(t, err.Error(), "AuthSecret")
}

func TestEncryptMismatchIsNamed(t *testing.T) {
	plain := func(o *Options) { o.AuthSecret = secret }
	for _, tc := range []struct {
		name                string
		producer, receiver  func(*Options)
		producerErr, logged string
	}{
		{"TLS producer, plaintext receiver", encrypted, plain,
			"the peer's data path is not encrypted: set encrypt on every peer",
			"the writer's data path is encrypted and ours is not: set encrypt on every peer"},
		{"plaintext producer, TLS receiver", plain, encrypted,
			"the peer's data path is encrypted and ours is not: set encrypt on every peer",
			"the writer's data path is not encrypted: set encrypt on every peer"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dst := sentinelRegion(4)
			var logs logTap
			b := newTransport(t, "b", dst, func(o *Options) { tc.receiver(o); o.Logf = logs.logf })
			a := newTransport(t, "a", randomRegion(t, 4), tc.producer)
			addPeer(t, a, "b", b)
			_, err := a.Write("b", []uint64{0}, []uint64{0})
			require.NoError(t, err)
			c := nextCompletion(t, a, waitLimit)
			require.ErrorIs(t, c.Err, ErrHandshake)
			assert.Contains(t, c.Err.Error(), tc.producerErr)
			logs.waitFor(t, tc.logged)
			assertRowsAt(t, data.Region{}, dst, nil, nil)
		})
	}
}

func TestEncryptWrongSecretFailsBothWays(t *testing.T) {
	t.Run("producer cannot prove it", func(t *testing.T) {
		dst := sentinelRegion(4)
		b := newTransport(t, "b", dst, encrypted)
		a := newTransport(t, "a", randomRegion(t, 4), func(o *Options) { o.AuthSecret, o.Encrypt = "wrong", true })
		addPeer(t, a, "b", b)
		_, err := a.Write("b", []uint64{0}, []uint64{0})
		require.NoError(t, err)
		c := nextCompletion(t, a, waitLimit)
		require.ErrorIs(t, c.Err, ErrAuthFailed)
		assert.Contains(t, c.Err.Error(), "a did not prove the shared secret")
		assertRowsAt(t, data.Region{}, dst, nil, nil)
	})
	t.Run("receiver cannot prove it", func(t *testing.T) {
		received := make(chan int, 1)
		addr := impostorReceiver(t, "wrong", received)
		a := newTransport(t, "a", randomRegion(t, 4), encrypted)
		addFakePeer(t, a, addr)
		_, err := a.Write("b", []uint64{0}, []uint64{0})
		require.NoError(t, err)
		c := nextCompletion(t, a, waitLimit)
		require.ErrorIs(t, c.Err, ErrAuthFailed)
		assert.Contains(t, c.Err.Error(), "receiver b")
		select {
		case n := <-received:
			assert.Zero(t, n, "bytes sent to a receiver that did not prove the secret")
		case <-time.After(waitLimit):
			t.Fatal("the impostor's connection was never closed")
		}
	})
}

// impostorReceiver speaks version 2 with its own secret, accepts any
// producer and reports how many bytes followed the hello.
func impostorReceiver(t *testing.T, impostorSecret string, received chan<- int) string {
	t.Helper()
	conf, err := newTLSConfigs()
	require.NoError(t, err)
	return acceptOne(t, func(raw net.Conn) {
		_ = raw.SetDeadline(time.Now().Add(waitLimit))
		fake := &Transport{tls: conf}
		h, err := fake.startServerTLS(raw)
		if err != nil {
			return
		}
		server := make([]byte, serverHelloLen)
		binary.LittleEndian.PutUint32(server, helloMagic)
		server[4] = encryptedVersion
		serverNonce := server[8:]
		_, _ = rand.Read(serverNonce)
		client := make([]byte, h.clientFixedLen())
		if _, err := h.Write(server); err != nil {
			return
		}
		if _, err := io.ReadFull(h, client); err != nil {
			return
		}
		id := make([]byte, binary.LittleEndian.Uint16(client[6:]))
		if _, err := io.ReadFull(h, id); err != nil {
			return
		}
		proof := serverMAC(impostorSecret, client[clientHelloLen:], serverNonce, h.exporter, string(id))
		if h.writeStatus(statusOK, proof, "") != nil {
			return
		}
		n, _ := io.Copy(io.Discard, h)
		received <- int(n)
	})
}

func TestEncryptRelayFailsAuthentication(t *testing.T) {
	// In plaintext mode this relay is transparent: the HMAC alone cannot
	// stop it (the control). Under TLS it must terminate TLS on both sides
	// to read and forward the hello, and the exporters then differ.
	for _, tc := range []struct {
		name    string
		encrypt bool
	}{{"plaintext relay works", false}, {"TLS relay is refused", true}} {
		t.Run(tc.name, func(t *testing.T) {
			mode := func(o *Options) { o.AuthSecret, o.Encrypt = secret, tc.encrypt }
			src, dst := randomRegion(t, 4), sentinelRegion(4)
			var logs logTap
			b := newTransport(t, "b", dst, func(o *Options) { mode(o); o.Logf = logs.logf })
			a := newTransport(t, "a", src, mode)
			relay := func(c, s net.Conn) { pipe(c, s, nil) }
			if tc.encrypt {
				relay = tlsRelay(t)
			}
			addr := proxy(t, b.DataAddr(), relay)
			require.NoError(t, a.AddPeer("b", data.PeerInfo{NumRows: 4, RowLen: rowLen, DataAddr: addr}))
			_, err := a.Write("b", []uint64{1}, []uint64{2})
			require.NoError(t, err)
			c := nextCompletion(t, a, waitLimit)
			if !tc.encrypt {
				require.NoError(t, c.Err)
				assertRowsAt(t, src, dst, []uint64{1}, []uint64{2})
				return
			}
			require.ErrorIs(t, c.Err, ErrAuthFailed)
			assert.Contains(t, c.Err.Error(), "a did not prove the shared secret")
			logs.waitFor(t, "authentication failed")
			assertRowsAt(t, data.Region{}, dst, nil, nil)
		})
	}
}

// tlsRelay is a man in the middle with its own certificate: it forwards the
// clear preamble, completes TLS with each side, then forwards every
// decrypted byte (the hellos included) unchanged.
func tlsRelay(t *testing.T) func(client, server net.Conn) {
	conf, err := newTLSConfigs()
	require.NoError(t, err)
	return func(client, server net.Conn) {
		deadline := time.Now().Add(waitLimit)
		_ = client.SetDeadline(deadline)
		_ = server.SetDeadline(deadline)
		preamble := make([]byte, serverHelloLen)
		if _, err := io.ReadFull(server, preamble); err != nil {
			return
		}
		if _, err := client.Write(preamble); err != nil {
			return
		}
		towardProducer := tls.Server(client, conf.server)
		towardReceiver := tls.Client(server, conf.client)
		if towardProducer.Handshake() != nil || towardReceiver.Handshake() != nil {
			return
		}
		pipe(towardProducer, towardReceiver, nil)
	}
}

func TestEncryptedHandshakeHasDeadline(t *testing.T) {
	const ioTimeout = 300 * time.Millisecond
	t.Run("producer, receiver silent after the preamble", func(t *testing.T) {
		release := make(chan struct{})
		defer close(release)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		defer ln.Close()
		go func() {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			preamble := make([]byte, serverHelloLen)
			binary.LittleEndian.PutUint32(preamble, helloMagic)
			preamble[4], preamble[5] = encryptedVersion, 1
			_, _ = c.Write(preamble)
			<-release // never answers the TLS ClientHello
		}()
		a := newTransport(t, "a", randomRegion(t, 4), func(o *Options) { encrypted(o); o.IOTimeout = ioTimeout })
		addFakePeer(t, a, ln.Addr().String())
		start := time.Now()
		_, err = a.Write("b", []uint64{0}, []uint64{0})
		require.NoError(t, err)
		c := nextCompletion(t, a, waitLimit)
		require.ErrorIs(t, c.Err, os.ErrDeadlineExceeded)
		assert.Contains(t, c.Err.Error(), "TLS handshake")
		assert.Less(t, time.Since(start), ioTimeout+2*time.Second)
	})
	t.Run("receiver, producer silent after the preamble", func(t *testing.T) {
		b := newTransport(t, "b", sentinelRegion(4), func(o *Options) { encrypted(o); o.IOTimeout = ioTimeout })
		c, err := net.Dial("tcp", b.DataAddr())
		require.NoError(t, err)
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(waitLimit))
		preamble := make([]byte, serverHelloLen)
		_, err = io.ReadFull(c, preamble)
		require.NoError(t, err)
		assert.Equal(t, byte(encryptedVersion), preamble[4])
		assert.Equal(t, make([]byte, nonceLen), preamble[8:], "no nonce in the clear")
		start := time.Now()
		_, err = c.Read(make([]byte, 1)) // no ClientHello: the receiver hangs up
		require.ErrorIs(t, err, io.EOF)
		assert.Less(t, time.Since(start), ioTimeout+2*time.Second)
	})
}

package zmqctl

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// testProxy forwards TCP to target. It keeps a copy of every byte, as a
// network observer would see them (saw), and after blackhole() swallows
// bytes both ways while keeping the connections open, like a peer whose
// process hangs: only ZMTP heartbeats can notice that.
type testProxy struct {
	addr    string
	dropped atomic.Bool
	mu      sync.Mutex
	seen    []byte
}

func newTestProxy(t testing.TB, target string) *testProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &testProxy{addr: l.Addr().String()}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				_ = in.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, in, out)
			mu.Unlock()
			wg.Go(func() { p.pipe(out, in) })
			wg.Go(func() { p.pipe(in, out) })
		}
	})
	t.Cleanup(func() {
		_ = l.Close()
		mu.Lock()
		for _, c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return p
}

func (p *testProxy) blackhole() { p.dropped.Store(true) }

// saw reports whether b crossed the proxy.
func (p *testProxy) saw(b []byte) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return bytes.Contains(p.seen, b)
}

func (p *testProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		if p.dropped.Load() {
			continue
		}
		p.mu.Lock()
		p.seen = append(p.seen, buf[:n]...)
		p.mu.Unlock()
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

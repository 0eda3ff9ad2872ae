package zmqctl

import (
	"net"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/require"
)

// blackholeProxy forwards TCP to target until blackhole() is called; from
// then on it swallows bytes both ways while keeping the connections open,
// like a peer whose process hangs. Only ZMTP heartbeats can notice that.
type blackholeProxy struct {
	addr    string
	dropped atomic.Bool
}

func newBlackholeProxy(t testing.TB, target string) *blackholeProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &blackholeProxy{addr: l.Addr().String()}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	track := func(c net.Conn) {
		mu.Lock()
		conns = append(conns, c)
		mu.Unlock()
	}
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
			track(in)
			track(out)
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

func (p *blackholeProxy) blackhole() { p.dropped.Store(true) }

func (p *blackholeProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if err != nil {
			return
		}
		if p.dropped.Load() {
			continue
		}
		if _, err := dst.Write(buf[:n]); err != nil {
			return
		}
	}
}

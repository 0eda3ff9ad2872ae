package tcpdata

import (
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/data"
)

// Connections that never say hello cannot exhaust the receiver: beyond the
// per-host bound they are closed at once, and a writer from another
// address still gets in.
func TestInboundConnectionsAreBounded(t *testing.T) {
	var mu sync.Mutex
	var logs []string
	tr, err := New(Options{
		LocalID: "127.0.0.1:1", Region: data.Region{Mem: make([]byte, 4*64), RowLen: 64},
		ListenHost: "127.0.0.1", MaxConns: 8, MaxConnsPerHost: 3,
		Logf: func(f string, a ...any) { mu.Lock(); logs = append(logs, f); mu.Unlock() },
	})
	require.NoError(t, err)
	defer tr.Close()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range 5 {
		c, err := net.Dial("tcp", tr.DataAddr())
		require.NoError(t, err)
		conns = append(conns, c)
	}
	closed := 0
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		buf := make([]byte, 64)
		if _, err := c.Read(buf); err != nil && !strings.Contains(err.Error(), "timeout") {
			closed++ // refused: closed without a hello
		}
	}
	assert.Equal(t, 2, closed, "two over the per-host bound of 3")
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	other, err := d.Dial("tcp", tr.DataAddr())
	require.NoError(t, err)
	defer other.Close()
	_ = other.SetReadDeadline(time.Now().Add(time.Second))
	n, err := other.Read(make([]byte, 8))
	require.NoError(t, err, "another source still gets the server hello")
	assert.Positive(t, n)
	mu.Lock()
	defer mu.Unlock()
	assert.Contains(t, strings.Join(logs, "\n"), "refused: %s")
}

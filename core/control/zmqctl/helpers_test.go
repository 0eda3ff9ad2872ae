package zmqctl

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/control"
)

// quietLogger keeps expected warnings (peer down, dropped frames) out of test output.
var quietLogger = slog.New(slog.NewTextHandler(io.Discard, nil))

// freePort returns a loopback TCP port that was free a moment ago.
func freePort(t testing.TB) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := l.Addr().(*net.TCPAddr).Port
	require.NoError(t, l.Close())
	return port
}

// newTestTransport binds a transport on an ephemeral loopback port,
// retrying when another process grabbed the port in between.
func newTestTransport(t testing.TB, opts Options) *Transport {
	t.Helper()
	if opts.Logger == nil {
		opts.Logger = quietLogger
	}
	for range 20 {
		port := freePort(t)
		tr, err := New(fmt.Sprintf("127.0.0.1:%d", port), "127.0.0.1", port, opts)
		if err != nil && strings.Contains(err.Error(), "in use") {
			continue
		}
		require.NoError(t, err)
		t.Cleanup(func() { _ = tr.Close() })
		return tr
	}
	t.Fatal("no free loopback port after 20 tries")
	return nil
}

// nextEvent returns the next event or fails the test after timeout.
func nextEvent(t testing.TB, tr control.Transport, timeout time.Duration) control.Event {
	t.Helper()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case ev, ok := <-tr.Events():
		require.True(t, ok, "events channel closed")
		return ev
	case <-timer.C:
		t.Fatalf("%s: no event within %v", tr.LocalID(), timeout)
		return control.Event{}
	}
}

// noEvent asserts that nothing arrives for d.
func noEvent(t testing.TB, tr control.Transport, d time.Duration) {
	t.Helper()
	select {
	case ev := <-tr.Events():
		t.Fatalf("%s: unexpected event %+v", tr.LocalID(), ev)
	case <-time.After(d):
	}
}

func portOf(t testing.TB, id string) int {
	t.Helper()
	_, p, err := net.SplitHostPort(id)
	require.NoError(t, err)
	n, err := strconv.Atoi(p)
	require.NoError(t, err)
	return n
}

// silentListener accepts TCP connections and never speaks ZMTP, so a
// DEALER dialing it never completes its handshake.
func silentListener(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	var conns []net.Conn
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := l.Accept()
			if err != nil {
				for _, c := range conns {
					_ = c.Close()
				}
				return
			}
			conns = append(conns, c)
		}
	}()
	t.Cleanup(func() {
		_ = l.Close()
		<-done
	})
	return l.Addr().String()
}

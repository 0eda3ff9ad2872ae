package zmqctl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/control"
)

// A connection that never came up is reported as a ConnectError with the
// cause the monitor can tell, not as a lost connection.
func TestAConnectionThatNeverCameUpIsAConnectError(t *testing.T) {
	a := newTestTransport(t, Options{ConnectTimeout: 5 * time.Second})
	nobody := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	require.NoError(t, a.Connect(nobody))
	ev := nextEvent(t, a, 10*time.Second)
	require.Equal(t, control.EventPeerDown, ev.Kind)
	var ce *control.ConnectError
	require.True(t, errors.As(ev.Err, &ce), "err: %v", ev.Err)
	assert.Equal(t, control.CauseRefused, ce.Cause)
	assert.True(t, ce.Unsure, "libzmq does not say why the connect failed")

	silent := silentListener(t)
	b := newTestTransport(t, Options{ConnectTimeout: 300 * time.Millisecond})
	require.NoError(t, b.Connect(silent))
	ev = nextEvent(t, b, 5*time.Second)
	require.True(t, errors.As(ev.Err, &ce), "err: %v", ev.Err)
	assert.Equal(t, control.CauseTimeout, ce.Cause)
	assert.ErrorIs(t, ev.Err, ErrConnectTimeout)
}

func TestEncryptMismatchIsAConnectError(t *testing.T) {
	a := newTestTransport(t, Options{Curve: curveKeys(t, "cluster secret"), ConnectTimeout: 5 * time.Second})
	b := newTestTransport(t, Options{})
	require.NoError(t, a.Connect(b.LocalID()))
	ev := nextEvent(t, a, 10*time.Second)
	var ce *control.ConnectError
	require.True(t, errors.As(ev.Err, &ce), "err: %v", ev.Err)
	assert.Equal(t, control.CauseEncryptMismatch, ce.Cause)
	assert.False(t, ce.Unsure)
}

// Diagnose names what libzmq cannot: a refused port, a name that does not
// resolve, a listener that answers.
func TestDiagnoseNamesWhyAPeerCannotBeReached(t *testing.T) {
	a := newTestTransport(t, Options{})
	cause, detail := a.Diagnose(fmt.Sprintf("127.0.0.1:%d", freePort(t)), 2*time.Second)
	assert.Equal(t, control.CauseRefused, cause)
	assert.Contains(t, detail, "connection refused")

	prev := lookupIPAddr
	lookupIPAddr = func(context.Context, string) ([]net.IPAddr, error) {
		return nil, &net.DNSError{Err: "no such host", Name: "prefill-0.svc", IsNotFound: true}
	}
	t.Cleanup(func() { lookupIPAddr = prev })
	cause, detail = a.Diagnose("prefill-0.svc:5710", 2*time.Second)
	assert.Equal(t, control.CauseUnresolvable, cause)
	assert.Contains(t, detail, `"prefill-0.svc" does not resolve`)

	cause, detail = a.Diagnose(silentListener(t), 2*time.Second)
	assert.Empty(t, cause, "a listener that accepts is reachable: %s", detail)
}

func TestDialFailuresAreNamed(t *testing.T) {
	dial := func(errno error) error {
		return &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", errno)}
	}
	for _, c := range []struct {
		err  error
		want string
	}{
		{dial(syscall.ECONNREFUSED), control.CauseRefused},
		{dial(syscall.ENETUNREACH), control.CauseUnreachable},
		{dial(syscall.EHOSTUNREACH), control.CauseUnreachable},
		{&net.OpError{Op: "dial", Net: "tcp", Err: context.DeadlineExceeded}, control.CauseTimeout},
		// What DialContext returns when its deadline passes (a black hole).
		{&net.OpError{Op: "dial", Net: "tcp", Err: os.ErrDeadlineExceeded}, control.CauseTimeout},
		{&net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "x"}}, control.CauseUnresolvable},
	} {
		got, detail := dialFailure(c.err, time.Second)
		assert.Equal(t, c.want, got, "%v", c.err)
		assert.NotEmpty(t, detail)
	}
}

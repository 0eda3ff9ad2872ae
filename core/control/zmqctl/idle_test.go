package zmqctl

import (
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func processCPU(t *testing.T) time.Duration {
	t.Helper()
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// The pump blocks in zmq_poll when idle: connected, heartbeating
// transports must not burn a core.
func TestIdleTransportsUseAlmostNoCPU(t *testing.T) {
	a := newTestTransport(t, Options{})
	b := newTestTransport(t, Options{})
	require.NoError(t, a.Send(b.LocalID(), []byte("x")))
	require.NoError(t, b.Send(a.LocalID(), []byte("y")))
	nextEvent(t, a, 5*time.Second)
	nextEvent(t, b, 5*time.Second)

	const idle = 2 * time.Second
	before := processCPU(t)
	time.Sleep(idle)
	used := processCPU(t) - before
	t.Logf("CPU over %v idle: %v", idle, used)
	assert.Less(t, used, idle/50, "more than 2%% of a core while idle")
}

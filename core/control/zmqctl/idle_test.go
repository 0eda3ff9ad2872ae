package zmqctl

import (
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
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

// The pump waits parked when idle: connected, heartbeating transports must
// not burn a core.
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

// An idle pump parks in Go's poller: no thread of the process sits in
// epoll_wait on its epoll set. A thread blocked there would hold one of the
// process's Ps, and a goroutine readied meanwhile (the tier's loop, woken by
// a host call) would wait for sysmon to take that P back, up to 10 ms.
func TestIdlePumpBlocksNoThreadInEpollWait(t *testing.T) {
	// epoll_wait, epoll_pwait, epoll_pwait2.
	waits := map[string]map[int]bool{"amd64": {232: true, 281: true, 441: true}, "arm64": {22: true, 441: true}}[runtime.GOARCH]
	if waits == nil {
		t.Skipf("no epoll syscall numbers for %s", runtime.GOARCH)
	}
	if _, err := os.ReadFile("/proc/thread-self/syscall"); err != nil {
		t.Skipf("this kernel does not show a thread's syscall: %v", err)
	}
	a := newTestTransport(t, Options{})
	b := newTestTransport(t, Options{})
	require.NoError(t, a.Send(b.LocalID(), []byte("x")))
	nextEvent(t, b, 5*time.Second)

	epfds := map[uint64]bool{uint64(a.pump.epfd): true, uint64(b.pump.epfd): true}
	for range 10 { // over 200 ms: the pumps are idle for all of it
		time.Sleep(20 * time.Millisecond)
		tasks, err := filepath.Glob("/proc/self/task/*/syscall")
		require.NoError(t, err)
		for _, path := range tasks {
			raw, err := os.ReadFile(path)
			if err != nil {
				continue // the thread exited
			}
			f := strings.Fields(string(raw))
			if len(f) < 2 {
				continue // running, not in a syscall
			}
			nr, _ := strconv.Atoi(f[0])
			fd, _ := strconv.ParseUint(strings.TrimPrefix(f[1], "0x"), 16, 64)
			require.False(t, waits[nr] && epfds[fd],
				"%s: a thread is blocked in epoll_wait on a pump's epoll set (%s)", path, strings.TrimSpace(string(raw)))
		}
	}
}

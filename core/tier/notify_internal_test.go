package tier

import (
	"encoding/binary"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

func TestNotifierSignalBeforeOpenAndAfterCloseIsANoOp(t *testing.T) {
	var n notifier
	n.signal() // never opened: nothing to write
	fd, created, err := n.get()
	require.NoError(t, err)
	require.True(t, created)
	again, created, err := n.get()
	require.NoError(t, err)
	assert.False(t, created)
	assert.Equal(t, fd, again)

	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	require.NoError(t, err)
	assert.NotZero(t, flags&unix.O_NONBLOCK, "EFD_NONBLOCK")
	fdFlags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0)
	require.NoError(t, err)
	assert.NotZero(t, fdFlags&unix.FD_CLOEXEC, "EFD_CLOEXEC")

	var buf [8]byte
	_, err = unix.Read(fd, buf[:])
	require.ErrorIs(t, err, unix.EAGAIN, "not readable before a signal")
	n.signal()
	n.signal()
	k, err := unix.Read(fd, buf[:])
	require.NoError(t, err)
	require.Equal(t, 8, k)

	require.NoError(t, n.Close())
	require.NoError(t, n.Close())
	n.signal() // after Close: no write to a closed (or reused) fd
	_, _, err = n.get()
	require.ErrorIs(t, err, ErrClosed)
}

func TestNotifierSignalsRacingCloseAreSafe(t *testing.T) {
	for range 20 {
		var n notifier
		_, _, err := n.get()
		require.NoError(t, err)
		var wg sync.WaitGroup
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for range 200 {
					n.signal()
				}
			}()
		}
		require.NoError(t, n.Close())
		wg.Wait()
	}
}

func TestNotifierNeverBlocksOnAFullCounter(t *testing.T) {
	var n notifier
	fd, _, err := n.get()
	require.NoError(t, err)
	defer n.Close()
	// Fill the counter to its maximum (2^64-2); the next write would block
	// on a blocking eventfd, and here returns EAGAIN, which signal ignores.
	full := binary.NativeEndian.AppendUint64(nil, ^uint64(0)-1)
	_, err = unix.Write(fd, full)
	require.NoError(t, err)
	n.signal()
	n.signal()
}

//go:build unix

package tcpdata

import (
	"net"
	"syscall"
)

// pendingBytes says how many bytes (up to 64) c has received that nobody
// read yet: a writer whose hello waits in the socket has sent it, even if
// its goroutine has not run since.
func pendingBytes(c net.Conn) int64 {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return 0
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return 0
	}
	var n int
	var buf [64]byte
	_ = raw.Control(func(fd uintptr) {
		n, _, err = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	})
	if err != nil || n < 0 {
		return 0
	}
	return int64(n)
}

package tcpdata

import (
	"net"

	"golang.org/x/sys/unix"
)

// limitUnsent keeps at most maxUnsentBytes of a producer connection's
// bytes waiting in the kernel behind those on the link (TCP_NOTSENT_LOWAT):
// what the kernel already holds is sent even if its transfer is canceled,
// so it must stay small next to a part.
func limitUnsent(c net.Conn) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return
	}
	_ = raw.Control(func(fd uintptr) {
		_ = unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_NOTSENT_LOWAT, maxUnsentBytes)
	})
}

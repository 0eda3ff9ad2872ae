//go:build !linux

package tcpdata

import "net"

// limitUnsent has no portable knob here: the kernel's send buffer decides.
func limitUnsent(net.Conn) {}

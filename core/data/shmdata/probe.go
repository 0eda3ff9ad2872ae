package shmdata

import (
	"fmt"
	"net"
)

// Probe reports whether this process can serve the same-host path at all:
// it opens and closes an abstract Unix socket of the kind grants are served
// on. Whether a given region can be granted (it must be a shared file
// mapping, as vLLM's /dev/shm region is) is known only once there is one.
func Probe() error {
	name, err := randomHex(socketRandLen)
	if err != nil {
		return fmt.Errorf("shmdata: socket name: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: socketPrefix + "probe-" + name, Net: "unix"})
	if err != nil {
		return fmt.Errorf("no abstract Unix socket for grants: %w", err)
	}
	return ln.Close()
}

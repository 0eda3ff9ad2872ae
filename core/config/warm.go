package config

import (
	"fmt"
	"net"
	"strconv"
)

// checkKeepWarm refuses a keep_warm list a node could not keep: an entry
// that is no "host:port", a wildcard, our own id, a repeat, or more
// entries than half the session slots (the rest stay for the peers that
// dial us and for the sources requests name), or a peer allowed_peers
// refuses (it would be refused at every redial, once a second, forever).
func checkKeepWarm(c Config, allowed PeerList) error {
	if c.MaxPeers > 0 && len(c.KeepWarm) > c.MaxPeers/2 {
		return fmt.Errorf("keep_warm lists %d peers, more than half of max_peers (%d)", len(c.KeepWarm), c.MaxPeers)
	}
	seen := map[string]bool{}
	for i, id := range c.KeepWarm {
		host, port, err := net.SplitHostPort(id)
		if err != nil || host == "" {
			return fmt.Errorf("keep_warm[%d] %q is not \"host:port\" (an IPv6 address goes in brackets: \"[fd00::1]:5710\")", i, id)
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return fmt.Errorf("keep_warm[%d] %q: port must be 1..65535", i, id)
		}
		if IsWildcard(host) {
			return fmt.Errorf("keep_warm[%d] %q is a wildcard, not a peer's address", i, id)
		}
		if id == c.LocalID() {
			return fmt.Errorf("keep_warm[%d] %q is this node's own id", i, id)
		}
		if !allowed.AllowsPeerID(id) {
			return fmt.Errorf("keep_warm[%d] %q is outside allowed_peers, so it would never be dialed: "+
				"add its address, network or name to allowed_peers, or drop it from keep_warm", i, id)
		}
		if seen[id] {
			return fmt.Errorf("keep_warm[%d] %q is listed twice", i, id)
		}
		seen[id] = true
	}
	return nil
}

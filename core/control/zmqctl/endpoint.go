package zmqctl

import (
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/peerkv/peerkv/core/control"
)

// endpoint is a ZMQ tcp address and whether it needs ZMQ_IPV6.
type endpoint struct {
	addr string
	ipv6 bool
}

func tcpEndpoint(host string, port int) endpoint {
	return endpoint{
		addr: "tcp://" + net.JoinHostPort(host, strconv.Itoa(port)),
		ipv6: strings.Contains(host, ":"),
	}
}

// parsePeerID turns "host:port" into the address to dial. Besides the Go
// forms ("10.0.0.1:5710", "[::1]:5710") it accepts "::1:5710", which is how
// vLLM spells the id of a peer configured with a bare IPv6 host.
func parsePeerID(peerID string) (endpoint, error) {
	host, portText, err := net.SplitHostPort(peerID)
	if err != nil {
		cut := strings.LastIndexByte(peerID, ':')
		if cut < 0 || net.ParseIP(peerID[:cut]) == nil {
			return endpoint{}, fmt.Errorf("%w: %q", control.ErrBadPeerID, peerID)
		}
		host, portText = peerID[:cut], peerID[cut+1:]
	}
	port, err := strconv.Atoi(portText)
	if host == "" || err != nil || port < 1 || port > 65535 {
		return endpoint{}, fmt.Errorf("%w: %q", control.ErrBadPeerID, peerID)
	}
	return tcpEndpoint(host, port), nil
}

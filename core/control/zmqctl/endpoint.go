package zmqctl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

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

// resolveTimeout bounds the name lookup of a bind host.
const resolveTimeout = 10 * time.Second

// lookupIPAddr resolves a bind host; a variable so tests can stand in a
// resolver without touching the network.
var lookupIPAddr = net.DefaultResolver.LookupIPAddr

// bindEndpoint is the address the ROUTER binds for host:port. libzmq before
// 4.3.5 (Debian 12 ships 4.3.4) does not resolve host names on bind: it
// takes "localhost" for an interface name and fails with "no such device",
// where pyzmq's bundled libzmq, and so vLLM's tier, binds the address the
// name resolves to. So a name is resolved here, with Go's resolver, and the
// ROUTER binds an address. When the name has several addresses the first
// IPv4 one (in the resolver's order) is bound, as libzmq does without
// ZMQ_IPV6 and as Go's net.Listen does (so the TCP data listener, given the
// same name, binds the same address); the first IPv6 one, with ZMQ_IPV6,
// only when the name has no IPv4 address. "localhost" is therefore bound on
// 127.0.0.1 wherever /etc/hosts lists it.
//
// Left to libzmq as they are: IP literals (IPv6 ones, zone included, with
// ZMQ_IPV6), the wildcards "*", "0.0.0.0" and "::", and names of network
// interfaces ("eth0"), which libzmq resolves on bind itself.
//
// Only the bind address changes: the identity peers dial stays the
// configured "host:port", as in vLLM.
func bindEndpoint(host string, port int) (endpoint, error) {
	if host == "" {
		return endpoint{}, errors.New("bind host is empty")
	}
	if host == "*" || strings.Contains(host, ":") || net.ParseIP(host) != nil {
		return tcpEndpoint(host, port), nil
	}
	if _, err := net.InterfaceByName(host); err == nil {
		return tcpEndpoint(host, port), nil
	}
	where := tcpEndpoint(host, port).addr // named in every error, as bind errors are
	if strings.Trim(host, "0123456789.") == "" {
		// No host name is all digits; this is a mistyped IPv4 address.
		return endpoint{}, fmt.Errorf("%s: bind host %q is not a valid IP address", where, host)
	}
	ctx, cancel := context.WithTimeout(context.Background(), resolveTimeout)
	defer cancel()
	addrs, err := lookupIPAddr(ctx, host)
	if err != nil {
		return endpoint{}, fmt.Errorf("%s: bind host %q did not resolve to an address: %w", where, host, err)
	}
	first6 := ""
	for _, a := range addrs {
		if ip4 := a.IP.To4(); ip4 != nil {
			return tcpEndpoint(ip4.String(), port), nil
		}
		if first6 == "" && a.IP.To16() != nil {
			first6 = a.String() // a link-local address keeps its zone
		}
	}
	if first6 == "" {
		return endpoint{}, fmt.Errorf("%s: bind host %q did not resolve to an address (the resolver returned none)", where, host)
	}
	return tcpEndpoint(first6, port), nil
}

// parsePeerID turns "host:port" into the address to dial. Besides the Go
// forms ("10.0.0.1:5710", "[::1]:5710") it accepts "::1:5710", which is how
// vLLM spells the id of a peer configured with a bare IPv6 host. A name is
// left to libzmq, which resolves names on connect (in its I/O thread, so
// Send never waits for a lookup).
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

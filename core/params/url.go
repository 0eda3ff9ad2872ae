package params

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// remote_url grammar (docs/vllm.md, "Endpoints"):
//
//	remote_url = scheme "://" host ":" port
//	scheme     = control [ "+" data ]    ; case-insensitive
//	control    = "tcp"                   ; ZMQ over TCP, vLLM's control wire
//	data       = name                    ; reserved: names a data path, refused today
//	host       = IPv4address / "[" IPv6address "]" / hostname
//	port       = 1..65535 in decimal, no leading zero; required
//
// Everything else is reserved and refused with its name: other control
// transports, a "+data" part, user info, a path, a query or a fragment, and
// IPv6 zone ids.

// controlSchemes are the control transports a URL may name.
var controlSchemes = map[string]bool{"tcp": true}

// reservedControl are transports a later revision may add (ZMQ's own, and
// TLS-wrapped TCP); named apart so the error says "not yet", not "unknown".
var reservedControl = map[string]bool{"ipc": true, "inproc": true, "tls": true, "ws": true, "wss": true}

// reservedData are the data paths a "+data" part may name one day.
var reservedData = map[string]bool{"nixl": true, "tcp": true, "shm": true, "rdma": true}

// maxHostLen is the longest DNS name (RFC 1035).
const maxHostLen = 253

// parseURL returns the host (brackets removed) and port of a remote_url.
func parseURL(s string) (string, int, error) {
	scheme, rest, ok := strings.Cut(s, "://")
	if !ok || scheme == "" {
		return "", 0, fmt.Errorf("%q is not a URL of the form tcp://HOST:PORT", cut(s))
	}
	if err := checkScheme(strings.ToLower(scheme)); err != nil {
		return "", 0, err
	}
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		return "", 0, fmt.Errorf("%q: a path, query or fragment is reserved; write tcp://HOST:PORT", cut(s))
	}
	if strings.Contains(rest, "@") {
		return "", 0, fmt.Errorf("%q: user info is not allowed; write tcp://HOST:PORT", cut(s))
	}
	host, portText, err := splitAuthority(rest)
	if err != nil {
		return "", 0, fmt.Errorf("%q: %v", cut(s), err)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 1 || port > 65535 || strings.Trim(portText, "0123456789") != "" || portText[0] == '0' {
		return "", 0, fmt.Errorf("%q: port must be an integer in 1..65535, got %q", cut(s), cut(portText))
	}
	return host, port, nil
}

func checkScheme(scheme string) error {
	control, data, hasData := strings.Cut(scheme, "+")
	switch {
	case reservedControl[control]:
		return fmt.Errorf("scheme %q: control transport %q is reserved, not supported yet; use tcp://", scheme, control)
	case !controlSchemes[control]:
		return fmt.Errorf("unknown scheme %q; the only control transport is tcp (tcp://HOST:PORT)", cut(scheme))
	case hasData && reservedData[data]:
		return fmt.Errorf("scheme %q: naming the data path (+%s) is reserved for a later revision; "+
			"the data path is agreed per peer in the handshake, so write tcp://", scheme, data)
	case hasData:
		return fmt.Errorf("scheme %q: unknown data path %q (and naming one is reserved); write tcp://", cut(scheme), cut(data))
	}
	return nil
}

// splitAuthority splits "host:port" / "[v6]:port" and checks the host.
func splitAuthority(a string) (host, port string, err error) {
	if strings.HasPrefix(a, "[") {
		end := strings.IndexByte(a, ']')
		if end < 0 {
			return "", "", fmt.Errorf("IPv6 address without its closing ]")
		}
		host, rest := a[1:end], a[end+1:]
		if strings.Contains(host, "%") {
			return "", "", fmt.Errorf("IPv6 zone ids are not supported")
		}
		if ip := net.ParseIP(host); ip == nil || !strings.Contains(host, ":") {
			return "", "", fmt.Errorf("%q in brackets is not an IPv6 address", cut(host))
		}
		p, ok := strings.CutPrefix(rest, ":")
		if !ok || p == "" {
			return "", "", fmt.Errorf("the port is missing")
		}
		return host, p, nil
	}
	i := strings.LastIndexByte(a, ':')
	if i < 0 || i == len(a)-1 {
		return "", "", fmt.Errorf("the port is missing")
	}
	host, port = a[:i], a[i+1:]
	if strings.Contains(host, ":") {
		return "", "", fmt.Errorf("an IPv6 address must be in brackets, e.g. tcp://[fd00::2]:5710")
	}
	if err := checkHostname(host); err != nil {
		return "", "", err
	}
	return host, port, nil
}

// checkHostname accepts an IPv4 address or a DNS name (RFC 1123 labels).
func checkHostname(h string) error {
	if h == "" {
		return fmt.Errorf("the host is empty")
	}
	if strings.Trim(h, "0123456789.") == "" {
		if ip := net.ParseIP(h); ip == nil || ip.To4() == nil {
			return fmt.Errorf("%q is not a valid IPv4 address", cut(h))
		}
		return nil
	}
	if len(h) > maxHostLen {
		return fmt.Errorf("host name of %d bytes, limit %d", len(h), maxHostLen)
	}
	for _, label := range strings.Split(strings.TrimSuffix(h, "."), ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("%q is not a valid host name", cut(h))
		}
		for _, c := range label {
			if !(c == '-' || c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z') {
				return fmt.Errorf("%q is not a valid host name (character %q)", cut(h), c)
			}
		}
	}
	return nil
}

// cut bounds how much of a caller's string an error repeats.
func cut(s string) string {
	const limit = 64
	if len(s) > limit {
		return s[:limit] + "..."
	}
	return s
}

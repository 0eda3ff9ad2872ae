package config

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
)

// PeerList is allowed_peers, parsed: the peers this node dials and admits.
// Its zero value allows every peer (the option unset).
//
// The rule, the same for dials and for connects:
//   - An address entry (a CIDR such as "10.0.0.0/8" or "fd00::/8", or one
//     address, read as /32 or /128) matches IP addresses inside it.
//   - A name entry ("prefill-0.svc") matches that host name exactly, case
//     and a trailing dot aside; "*.svc.cluster.local" matches every name
//     ending in ".svc.cluster.local".
//   - A peer the orchestrator names by address (kv_transfer_params'
//     remote_host) is dialed only when an address entry holds it; one it
//     names by host name only when a name entry matches the name as given.
//     A name is never resolved to be checked: what libzmq dials is resolved
//     again later, when DNS may answer differently, and a lookup would
//     stall the host's thread. So a CIDR never admits a name.
//   - A peer that dials us is checked by the address its connection comes
//     from (the kernel's, not the id it claims), against the address
//     entries only, which is why a list of names alone is refused (a peer
//     we dial answers over a connection of its own into this node).
type PeerList struct {
	set      bool
	prefixes []netip.Prefix
	names    map[string]bool
	suffixes []string // "*.svc" kept as ".svc"
}

// errNoAddress refuses a list of names alone: it would let us dial a
// named peer but shut the connection that peer answers on.
var errNoAddress = errors.New(`allowed_peers lists no address: a peer's connection into this node ` +
	`(its answers to our dials, its own requests) is admitted by its source address, ` +
	`so list the peers' networks too (e.g. ["10.0.0.0/8", "fd00::/8"])`)

// ParsePeerList checks and parses allowed_peers; nil allows every peer.
func ParsePeerList(entries []string) (PeerList, error) {
	if entries == nil {
		return PeerList{}, nil
	}
	if len(entries) == 0 {
		return PeerList{}, fmt.Errorf("allowed_peers is empty, which would refuse every peer: " +
			"omit it to allow any peer, or list the peers' networks (e.g. [\"10.0.0.0/8\", \"fd00::/8\"])")
	}
	l := PeerList{set: true, names: map[string]bool{}}
	for i, e := range entries {
		if err := l.add(e); err != nil {
			return PeerList{}, fmt.Errorf("allowed_peers[%d] %q %v", i, e, err)
		}
	}
	if len(l.prefixes) == 0 {
		return PeerList{}, errNoAddress
	}
	return l, nil
}

func (l *PeerList) add(e string) error {
	if strings.Contains(e, "/") {
		p, err := netip.ParsePrefix(e)
		if err != nil {
			return fmt.Errorf("is not a CIDR (want an address/bits such as \"10.0.0.0/8\" or \"fd00::/8\")")
		}
		if p.Addr().Is4In6() {
			return fmt.Errorf("is an IPv4-mapped IPv6 prefix: write the IPv4 one")
		}
		if p.Masked() != p {
			return fmt.Errorf("has bits set past its /%d: write %q", p.Bits(), p.Masked().String())
		}
		l.prefixes = append(l.prefixes, p)
		return nil
	}
	if a, err := netip.ParseAddr(e); err == nil {
		if a.Zone() != "" {
			return fmt.Errorf("has a zone: write the address alone")
		}
		a = a.Unmap()
		l.prefixes = append(l.prefixes, netip.PrefixFrom(a, a.BitLen()))
		return nil
	}
	name, wild := strings.CutPrefix(e, "*.")
	if !validHostName(name) {
		return fmt.Errorf("is not a CIDR, an IP address or a host name (a wildcard name is written \"*.example.svc\")")
	}
	name = canonicalName(name)
	if wild {
		l.suffixes = append(l.suffixes, "."+name)
	} else {
		l.names[name] = true
	}
	return nil
}

// validHostName: dot-separated labels of letters, digits, '-' and '_', each
// 1..63 bytes, 253 in all, a trailing dot allowed; the last label not all
// digits, so a mistyped address ("10.0.0.300") is not taken for a name.
func validHostName(s string) bool {
	s = strings.TrimSuffix(s, ".")
	if s == "" || len(s) > 253 {
		return false
	}
	labels := strings.Split(s, ".")
	for _, lb := range labels {
		if lb == "" || len(lb) > 63 || lb[0] == '-' || lb[len(lb)-1] == '-' {
			return false
		}
		for _, c := range []byte(lb) {
			ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
			if !ok {
				return false
			}
		}
	}
	last := labels[len(labels)-1]
	return strings.Trim(last, "0123456789") != ""
}

func canonicalName(s string) string { return strings.ToLower(strings.TrimSuffix(s, ".")) }

// AllowsAll reports whether the option is unset.
func (l PeerList) AllowsAll() bool { return !l.set }

// AllowsHost reports whether a peer named by host (the host part of its id,
// as an orchestrator names it) may be dialed.
func (l PeerList) AllowsHost(host string) bool {
	if !l.set {
		return true
	}
	if a, err := netip.ParseAddr(strings.Trim(host, "[]")); err == nil {
		return l.holds(a)
	}
	name := canonicalName(host)
	if l.names[name] {
		return true
	}
	for _, suf := range l.suffixes {
		if strings.HasSuffix(name, suf) {
			return true
		}
	}
	return false
}

// AllowsPeerID is AllowsHost of a "host:port" id; an id without a port is
// refused when a list is set.
func (l PeerList) AllowsPeerID(peerID string) bool {
	if !l.set {
		return true
	}
	host, _, err := net.SplitHostPort(peerID)
	return err == nil && l.AllowsHost(host)
}

// AllowsAddr reports whether a connection from addr (an IP address, as the
// kernel reports it) may open a session.
func (l PeerList) AllowsAddr(addr string) bool {
	if !l.set {
		return true
	}
	a, err := netip.ParseAddr(addr)
	return err == nil && l.holds(a)
}

func (l PeerList) holds(a netip.Addr) bool {
	a = a.WithZone("").Unmap()
	for _, p := range l.prefixes {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

package tier

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/session"
)

// Who may hold a session here. allowed_peers (config.PeerList) is checked
// before every dial (a request's sources, a probe, a peer's TCP data
// address) and for every connect from an unknown identity, by the address
// its connection comes from. Under pressure for slots, sessions are counted
// per network (IPv4 /24, IPv6 /64) as well as per address, and a newcomer
// from a less crowded network takes the slot of the least useful session of
// the most crowded one when that network holds more than one address's
// quota, so one host's many addresses cannot keep max_peers to themselves
// by keeping their sessions alive.

// CauseNotAllowed: a peer outside allowed_peers (a dial not attempted, or
// its connect refused).
const CauseNotAllowed = "not_allowed"

// errNotAllowed: a dial refused by allowed_peers. The request is served
// locally; its line is the rate-limited one, not the per-request warning.
var errNotAllowed = errors.New("its host is not in allowed_peers")

// whyNotAllowed is admit's answer for a connect from outside the list.
const whyNotAllowed = "its address is not in allowed_peers"

// refusalLogEvery bounds the lines about refused peers to one per cause per
// interval; the next line says how many it stood for.
const refusalLogEvery = 10 * time.Second

// admission is the tier's part of the rule; peerSet holds it.
type admission struct {
	allow    config.PeerList
	dials    everyLog
	connects everyLog
	// atAccept counts connections the transport refused by address before
	// any connect of theirs reached us (Deps.NotAllowedAtAccept).
	atAccept func() uint64
}

func newAdmission(cfg config.Config) (admission, error) {
	allow, err := config.ParsePeerList(cfg.AllowedPeers)
	return admission{allow: allow}, err
}

// everyLog lets one line through per refusalLogEvery and counts the rest.
type everyLog struct {
	next       time.Time
	suppressed int
}

// take reports whether a line goes now and how many it stands for besides
// itself.
func (l *everyLog) take(now time.Time) (bool, int) {
	if now.Before(l.next) {
		l.suppressed++
		return false, 0
	}
	n := l.suppressed
	l.next, l.suppressed = now.Add(refusalLogEvery), 0
	return true, n
}

func (p *peerSet) logRefused(l *everyLog, format string, args ...any) {
	ok, more := l.take(p.now())
	if !ok {
		return
	}
	msg := fmt.Sprintf(format, args...)
	if more > 0 {
		msg += fmt.Sprintf(" (and %d more refused since the last such line)", more)
	}
	p.logf("WARNING", "%s", msg)
}

// refusedConnect logs a connect refused by allowed_peers, rate-limited.
func (p *peerSet) refusedConnect(peerID, addr, why string) {
	p.logRefused(&p.adm.connects, "refusing peer %s (from %s): %s", peerID, addr, why)
}

// mayDial is nil when peerID may be dialed, else errNotAllowed, logged;
// the caller counts it.
func (p *peerSet) mayDial(peerID string) error {
	if p.adm.allow.AllowsPeerID(peerID) {
		return nil
	}
	p.logRefused(&p.adm.dials, "not dialing %s: %v; requests naming it are served locally", peerID, errNotAllowed)
	return fmt.Errorf("%w: %s", errNotAllowed, peerID)
}

// register starts the data path's registration of s's peer, dropping its
// TCP data address when it is outside allowed_peers (the writer would dial
// it, and the peer chose it); it reports whether it dropped it, for the
// caller to count.
func (p *peerSet) register(s *session.Session, info data.PeerInfo) (refused bool) {
	if info.DataAddr != "" && !p.adm.allow.AllowsPeerID(info.DataAddr) {
		p.logRefused(&p.adm.dials, "not dialing %s, the TCP data address peer %s gave: %v; the TCP path is off for it",
			info.DataAddr, s.PeerID(), errNotAllowed)
		info.DataAddr = ""
		refused = true
	}
	p.reg.add(s, info)
	return refused
}

// notAllowedAtAccept counts the connections the transport refused by
// address before any connect of theirs reached us.
func (p *peerSet) notAllowedAtAccept() uint64 {
	if p.adm.atAccept == nil {
		return 0
	}
	return p.adm.atAccept()
}

// networkOf groups source addresses: IPv4 by /24, IPv6 by /64; anything
// else (an unknown address) is a group of its own.
func networkOf(addr string) string {
	a, err := netip.ParseAddr(addr)
	if err != nil {
		return addr
	}
	a = a.Unmap().WithZone("")
	bits := 64
	if a.Is4() {
		bits = 24
	}
	p, _ := a.Prefix(bits)
	return p.String()
}

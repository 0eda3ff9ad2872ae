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

// admission is the tier's part of the rule; guarded by t.mu.
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

func (t *Tier) logRefused(l *everyLog, format string, args ...any) {
	ok, more := l.take(t.now())
	if !ok {
		return
	}
	msg := fmt.Sprintf(format, args...)
	if more > 0 {
		msg += fmt.Sprintf(" (and %d more refused since the last such line)", more)
	}
	t.logf("WARNING", "%s", msg)
}

// mayDial is nil when peerID may be dialed, else errNotAllowed, counted
// and logged.
func (t *Tier) mayDial(peerID string) error {
	if t.adm.allow.AllowsPeerID(peerID) {
		return nil
	}
	t.obs.rejections[CauseNotAllowed]++
	t.logRefused(&t.adm.dials, "not dialing %s: %v; requests naming it are served locally", peerID, errNotAllowed)
	return fmt.Errorf("%w: %s", errNotAllowed, peerID)
}

// allowedData drops a peer's TCP data address when it is outside
// allowed_peers: the writer would dial it, and the peer chose it.
func (t *Tier) allowedData(s *session.Session, info data.PeerInfo) data.PeerInfo {
	if info.DataAddr == "" || t.adm.allow.AllowsPeerID(info.DataAddr) {
		return info
	}
	t.obs.rejections[CauseNotAllowed]++
	t.logRefused(&t.adm.dials, "not dialing %s, the TCP data address peer %s gave: %v; the TCP path is off for it",
		info.DataAddr, s.PeerID(), errNotAllowed)
	info.DataAddr = ""
	return info
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

// makeRoom frees a slot when every one is taken, by ending the least useful
// session that dialed us from the most crowded network, if that network
// holds more sessions than one address may (max_peers_per_host: a network
// within one address's quota never yields, so a stranger cannot churn a
// real cluster's sessions) and at least two more than the newcomer's (from
// addr; a peer we dial counts as a network of none), so the two never trade
// a slot back and forth. It reports whether a slot was freed.
func (t *Tier) makeRoom(addr string, dialing bool) bool {
	counts := map[string]int{}
	for _, s := range t.sessions {
		if !s.Dead() && !s.Dialed() { // the sessions we dialed carry our own loads
			counts[networkOf(s.Source())]++
		}
	}
	mine := 0
	if !dialing {
		mine = counts[networkOf(addr)]
	}
	crowded, most := "", 0
	for n, c := range counts {
		if c > most || (c == most && n < crowded) {
			crowded, most = n, c
		}
	}
	if most <= t.cfg.MaxPeersPerHost || most < mine+2 {
		return false
	}
	var victim *session.Session
	quietSince := t.now().Add(-evictableQuiet)
	for _, s := range t.sessions {
		if s.Dead() || s.Dialed() || networkOf(s.Source()) != crowded {
			continue
		}
		// A session heard from just now is never the one to go (a
		// stranger's newcomer must not cut a pull under way); among the
		// rest, one with nothing in flight goes first (lessUseful).
		if s.LastActivity().After(quietSince) {
			continue
		}
		if victim == nil || lessUseful(s, victim) {
			victim = s
		}
	}
	if victim == nil {
		return false
	}
	t.stats.sessionsEvicted++
	victim.Close(fmt.Sprintf("evicted: every session slot is taken (max_peers), %d by peers from %s, "+
		"and a peer from a less crowded network needs one", most, crowded), session.Orderly)
	victim.Release()
	t.settle()
	return true
}

// evictableQuiet: how long a session must have been quiet before makeRoom
// may end it for a newcomer.
const evictableQuiet = 250 * time.Millisecond

// lessUseful orders eviction candidates: one with nothing in flight before
// one with work, then the longest quiet first.
func lessUseful(a, b *session.Session) bool {
	if aw, bw := a.HasPendingWork(), b.HasPendingWork(); aw != bw {
		return bw
	}
	return a.LastActivity().Before(b.LastActivity())
}

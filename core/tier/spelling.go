package tier

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"time"
)

// A peer whose own id is spelled otherwise than the id we dial (`host:
// $(hostname)` on it, its IP address in kv_transfer_params, or the
// reverse) answers our dial under its own id: the answer opens a second
// session under that id, the session we dialed never hears back, and every
// request to the peer waits for its deadlines. A connect under a new id on
// the same port, from the address a dialed session that never heard back
// points at, is that peer answering: it is said once, in words.

// spellingTimeout bounds the resolution of a dialed host name;
// maxSpellingChecks how many run at once (more are not checked).
const (
	spellingTimeout   = 2 * time.Second
	maxSpellingChecks = 8
)

// resolveHost resolves a dialed host name; a variable so tests need no DNS.
var resolveHost = net.DefaultResolver.LookupHost

// noteSpelling checks a connect from ownID, arriving from addr, against the
// sessions we dialed that never heard back.
func (p *peerSet) noteSpelling(ownID, addr string) {
	_, port, err := net.SplitHostPort(ownID)
	if err != nil || addr == "" {
		return
	}
	for id, s := range p.sessions {
		if id == ownID || !s.Dialed() || !s.Unheard() {
			continue
		}
		host, idPort, err := net.SplitHostPort(id)
		if err != nil || idPort != port {
			continue
		}
		if ip, err := netip.ParseAddr(host); err == nil {
			if ip.Unmap().String() == addr {
				p.logSpelling(id, ownID, addr)
			}
			continue
		}
		if p.spellingChecks >= maxSpellingChecks {
			continue
		}
		p.spellingChecks++
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), spellingTimeout)
			defer cancel()
			addrs, err := resolveHost(ctx, host)
			p.onLoop(func() {
				p.spellingChecks--
				if err == nil && slices.ContainsFunc(addrs, func(a string) bool { return sameIP(a, addr) }) {
					p.logSpelling(id, ownID, addr)
				}
			})
		}()
	}
}

func sameIP(a, b string) bool {
	x, errX := netip.ParseAddr(a)
	y, errY := netip.ParseAddr(b)
	return errX == nil && errY == nil && x.Unmap() == y.Unmap()
}

// logSpelling says that the peer we dial as dialed answered as ownID.
func (p *peerSet) logSpelling(dialed, ownID, addr string) {
	p.logf("WARNING", "peer %s answered our dial of %s under its own id %s (from %s): one peer spelled two ways "+
		"(a host name and an IP address?), so its answers reach another session and requests naming %s wait for "+
		"their deadlines; name it in kv_transfer_params by the id it uses itself (%s), or set its host option to "+
		"the spelling the orchestrator uses", ownID, dialed, ownID, addr, dialed, ownID)
}

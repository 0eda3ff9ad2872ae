package zmqctl

import (
	"fmt"
	"net/netip"
	"time"

	"golang.org/x/sys/unix"
)

// A peer restarted on the same address after a crash that sent no FIN or
// RST (power loss, a partition, a namespace torn down) dials our ROUTER
// again under its identity while its old connection still holds that
// identity here. In plaintext libzmq never reads the new connection (no
// handover, see Identity rules), even once the old one has gone. So:
//
//   - a silent connection yields: when an unheard connection from an
//     address has waited stuckAfter, every heard connection from that same
//     address that has received no byte for silentAfter (the ROUTER's
//     heartbeat interval plus silentMargin: a live peer's libzmq answers
//     each of our PINGs, so a live connection is never that quiet) is shut;
//   - when a connection that yielded so has ended, the unheard connections
//     from its address accepted before it ended are shut once they waited
//     stuckAfter: libzmq will never read them, and their dialers dial again,
//     to be heard now. (Only after a yield: connections end all the time,
//     and one from the same host still in its ZMTP handshake on a busy node
//     looks stuck too. After an end of any other kind, a stuck connection
//     goes at UnheardTimeout.)
//
// A live peer keeps its connection whoever dials under its identity: its
// connection is not silent, and only connections from the silent one's own
// address are shut with it (docs/security.md, G19).

// stuckAfter is how long a connection may stay unheard while the ROUTER had
// nothing else to read before it counts as a duplicate identity's (peers
// send as soon as they connect: it is heard within milliseconds otherwise).
const stuckAfter = 500 * time.Millisecond

// silentMargin is added to the heartbeat interval: a PONG's round trip and
// a loaded host's delays.
const silentMargin = 2 * time.Second

// silentCheckEvery paces the checks while a stuck connection waits.
const silentCheckEvery = 250 * time.Millisecond

func (p *pump) silentAfter() time.Duration { return p.t.opts.HeartbeatInterval + silentMargin }

// stuck reports whether c has waited unheard stuckAfter while the ROUTER
// drained (see expireUnheard).
func (p *pump) stuck(c *inboundConn, now time.Time) bool {
	drained := p.in.drainedAt
	if !p.routerMore && len(p.backlog) == 0 {
		drained = now
	}
	return !c.accepted.Add(stuckAfter).After(drained)
}

// yieldSilent applies the first rule and returns how long until it should
// look again (idle when no connection is stuck).
func (p *pump) yieldSilent(now time.Time, idle time.Duration) time.Duration {
	if len(p.in.unheard) == 0 {
		return idle
	}
	if now.Before(p.in.nextSilentCheck) {
		return p.in.nextSilentCheck.Sub(now)
	}
	p.pruneYieldedEnded(now)
	waiting := map[netip.Addr]bool{}
	next := idle
	for _, c := range p.in.unheard {
		if p.stuck(c, now) {
			waiting[c.remote.Addr()] = true
			if ended, ok := p.in.yieldedEnded[c.remote.Addr()]; ok && c.accepted.Before(ended) {
				p.shutStuck(c)
			}
		} else {
			next = min(next, max(c.accepted.Add(stuckAfter).Sub(now), silentCheckEvery))
		}
	}
	if len(waiting) == 0 {
		return next
	}
	p.in.nextSilentCheck = now.Add(silentCheckEvery)
	for _, c := range p.in.conns {
		if c.shut || !c.heard || !waiting[c.remote.Addr()] {
			continue
		}
		info, err := unix.GetsockoptTCPInfo(c.dup, unix.IPPROTO_TCP, unix.TCP_INFO)
		if err != nil {
			continue
		}
		quiet := time.Duration(info.Last_data_recv) * time.Millisecond
		if quiet >= p.silentAfter() {
			c.yielded = true
			p.shut(c, fmt.Sprintf("nothing received on it for %v while a new connection from the same address waits "+
				"unheard (a peer that restarted after its old connection died silently)", quiet.Round(time.Millisecond)))
		}
	}
	return silentCheckEvery
}

// yieldedGone applies the second rule once c, which yielded, has ended: it
// shuts the stuck connections from c's address now, and yieldSilent those
// that get stuck later.
func (p *pump) yieldedGone(c *inboundConn, now time.Time) {
	if p.in.yieldedEnded == nil {
		p.in.yieldedEnded = map[netip.Addr]time.Time{}
	}
	if len(p.in.yieldedEnded) >= p.t.opts.MaxInboundConns {
		p.pruneYieldedEnded(now)
		if len(p.in.yieldedEnded) >= p.t.opts.MaxInboundConns {
			clear(p.in.yieldedEnded) // bounded; only a stuck connection's early shut is lost
		}
	}
	p.in.yieldedEnded[c.remote.Addr()] = now
	for _, u := range p.in.unheard {
		if u.remote.Addr() == c.remote.Addr() && p.stuck(u, now) {
			p.shutStuck(u)
		}
	}
}

// pruneYieldedEnded forgets ends older than any unheard connection can be.
func (p *pump) pruneYieldedEnded(now time.Time) {
	for a, at := range p.in.yieldedEnded {
		if now.Sub(at) > unheardHardFactor*p.t.opts.UnheardTimeout {
			delete(p.in.yieldedEnded, a)
		}
	}
}

func (p *pump) shutStuck(c *inboundConn) {
	p.shut(c, "unheard while a connection from the same address held its identity, which has ended: "+
		"its dialer dials again, to be heard")
}

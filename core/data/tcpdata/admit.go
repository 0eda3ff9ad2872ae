package tcpdata

import (
	"fmt"
	"net"
	"slices"
	"sync/atomic"
)

// Inbound connections are admitted in two stages, so that strangers who
// never finish a hello cannot take the places of writers who did:
//
//   - in the hello: at most MaxHelloConns (MaxHelloConnsPerHost from one
//     source IP), each for at most HelloTimeout. A new connection beyond
//     either bound closes the oldest one still in its hello (from that IP,
//     or at all) instead of being refused, so a writer that dials always
//     gets its hello answered.
//   - proven (the hello passed): at most MaxConns (MaxConnsPerHost from one
//     source IP); a hello beyond them is refused with statusBusy.

// connStage is where an inbound connection stands.
type connStage uint8

const (
	stageHello   connStage = iota // accepted, its hello not finished
	stageProven                   // its hello passed: it may send parts
	stageEvicted                  // closed while in the hello, for a newer one
	stageGone                     // its goroutine ended
)

// inboundConn is one accepted connection; its fields are guarded by t.mu.
type inboundConn struct {
	conn   net.Conn
	host   string // source IP
	stage  connStage
	peerID string        // set once its hello named the writer
	token  string        // the data token its hello proved ("" without grants)
	done   chan struct{} // closed when its goroutine can write no more
}

// admission counts inbound connections by stage; t.mu guards it.
type admission struct {
	hello         []*inboundConn // in the hello, oldest first
	helloPerHost  map[string]int
	proven        int
	provenPerHost map[string]int
}

func newAdmission() admission {
	return admission{helloPerHost: map[string]int{}, provenPerHost: map[string]int{}}
}

// inboundCounters count what happened to inbound connections and parts.
type inboundCounters struct {
	helloEvicted, helloFailed, overConnLimit atomic.Uint64
	partsNotOwed, partsRefused, partsNoRoom  atomic.Uint64
}

// InboundStats describe the receiving side of a Transport.
type InboundStats struct {
	HelloConns int   // connections in their hello now
	Conns      int   // connections that passed the hello, now
	HeldBytes  int64 // held for parts being received now (MaxHeldBytes at most)

	HelloEvicted  uint64 // connections closed in their hello to admit a newer one
	HelloFailed   uint64 // hellos refused or not finished within HelloTimeout
	OverConnLimit uint64 // proven writers refused: MaxConns or MaxConnsPerHost reached
	PartsNotOwed  uint64 // parts naming more rows than the writer's loads expect
	PartsRefused  uint64 // parts refused by the guard or the region's range
	PartsNoRoom   uint64 // parts refused because MaxHeldBytes stayed full
}

// InboundStats returns the receiver's connection counts and counters.
func (t *Transport) InboundStats() InboundStats {
	t.mu.Lock()
	st := InboundStats{HelloConns: len(t.admit.hello), Conns: t.admit.proven}
	t.mu.Unlock()
	st.HeldBytes = t.held.inUse()
	st.HelloEvicted = t.stats.helloEvicted.Load()
	st.HelloFailed = t.stats.helloFailed.Load()
	st.OverConnLimit = t.stats.overConnLimit.Load()
	st.PartsNotOwed = t.stats.partsNotOwed.Load()
	st.PartsRefused = t.stats.partsRefused.Load()
	st.PartsNoRoom = t.stats.partsNoRoom.Load()
	return st
}

// admitHello registers a new connection in its hello, closing the oldest
// in the hello from its IP, or at all, to make room; t.mu held.
func (t *Transport) admitHello(in *inboundConn) {
	a := &t.admit
	if a.helloPerHost[in.host] >= t.opts.MaxHelloConnsPerHost {
		i := slices.IndexFunc(a.hello, func(o *inboundConn) bool { return o.host == in.host })
		t.evictHello(i, fmt.Sprintf("%d connections from %s in their hello", a.helloPerHost[in.host], in.host))
	}
	if len(a.hello) >= t.opts.MaxHelloConns {
		t.evictHello(0, fmt.Sprintf("%d connections in their hello", len(a.hello)))
	}
	a.hello = append(a.hello, in)
	a.helloPerHost[in.host]++
}

// evictHello closes the i-th connection in the hello; t.mu held.
func (t *Transport) evictHello(i int, why string) {
	old := t.admit.hello[i]
	t.leaveHello(old)
	old.stage = stageEvicted
	_ = old.conn.Close()
	t.stats.helloEvicted.Add(1)
	t.logs.logf("connection closed in its hello for a newer one",
		"closed %s: %s (at most %d, %d from one IP, each for %v)", old.conn.RemoteAddr(), why,
		t.opts.MaxHelloConns, t.opts.MaxHelloConnsPerHost, t.opts.HelloTimeout)
}

// leaveHello removes in from the hello stage; t.mu held.
func (t *Transport) leaveHello(in *inboundConn) {
	a := &t.admit
	if i := slices.Index(a.hello, in); i >= 0 {
		a.hello = slices.Delete(a.hello, i, i+1)
		if a.helloPerHost[in.host]--; a.helloPerHost[in.host] <= 0 {
			delete(a.helloPerHost, in.host)
		}
	}
}

// promote moves in from its hello to the proven writers, or says why it
// may not write ("" when promoted); t.mu held.
func (t *Transport) promote(in *inboundConn) string {
	if in.stage != stageHello {
		return "closed during its hello"
	}
	t.leaveHello(in)
	in.stage = stageGone // unless promoted below
	a := &t.admit
	switch {
	case a.proven >= t.opts.MaxConns:
		return fmt.Sprintf("%d data connections already", a.proven)
	case a.provenPerHost[in.host] >= t.opts.MaxConnsPerHost:
		return fmt.Sprintf("%d data connections from %s already", a.provenPerHost[in.host], in.host)
	}
	in.stage = stageProven
	a.proven++
	a.provenPerHost[in.host]++
	return ""
}

// leave forgets in at the end of its goroutine; t.mu held.
func (t *Transport) leave(in *inboundConn) {
	a := &t.admit
	switch in.stage {
	case stageHello:
		t.leaveHello(in)
	case stageProven:
		a.proven--
		if a.provenPerHost[in.host]--; a.provenPerHost[in.host] <= 0 {
			delete(a.provenPerHost, in.host)
		}
	}
	in.stage = stageGone
}

func remoteHost(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	return c.RemoteAddr().String()
}

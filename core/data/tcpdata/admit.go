package tcpdata

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"net"
	"slices"
	"sync/atomic"
	"time"
)

// provenGrace is how long a proven connection is safe from eviction after
// it was admitted or last received rows its writer was owed: a producer
// between parts of one load sends its next part well within it.
const provenGrace = time.Second

// connsPerStream is how many proven connections one writer (peer id) may
// hold per stream of ours: a producer opens Streams, and a re-added link
// briefly overlaps the connections it replaces.
const connsPerStream = 4

// Inbound connections are admitted in two stages, so that strangers who
// never finish a hello cannot take the places of writers who did:
//
//   - in the hello: at most MaxHelloConns (MaxHelloConnsPerHost from one
//     source IP), each for at most HelloTimeout. A newcomer is let in: beyond
//     the bound of its IP it closes one still in its hello from that IP,
//     beyond the total one from the IP holding the most, chosen among those
//     we have begun to serve as the furthest from finishing a hello as a
//     writer does (see evictionCandidate). A writer sends each message of
//     its hello whole and answers ours at once, so connections that sent
//     stray bytes, stopped mid-message (the start of a real hello, never
//     the rest) or sent nothing give way before one that sent each message
//     whole, which waits on its own round trip; that one is never closed
//     while one from its IP is not served yet. Only strangers from its IP
//     that each send whole messages and have waited less than the writer
//     can still close it; the producer then dials again (sender.connect).
//     The accept loop paces itself on the hellos it starts (servePace),
//     and refuses a newcomer only when none it could replace has been
//     served yet, or only a writer's progress could make room.
//   - proven (the hello passed): at most MaxConns (MaxConnsPerHost from one
//     source IP, connsPerStream × Streams from one writer). A hello beyond
//     any of them closes the proven connection (of that writer, that IP, or
//     at all) that has gone longest without receiving rows it was owed, if
//     that is longer than provenGrace and it is not receiving a part now;
//     else it is refused with statusBusy. So a stranger holding a token but
//     owed nothing cannot keep places a writer with rows owed needs, and a
//     connection still in its hello never closes a proven one.

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

	accepted time.Time
	bytesIn  atomic.Int64 // read from the raw connection (below TLS)
	// shaped counts the first bytes read that fit the start of a hello
	// (helloShape), up to its length; -1 once one did not.
	shaped atomic.Int32
	// waitingSince is when its goroutine began waiting to read from it
	// (unix ns, below TLS; 0 while not waiting): since then the writer owes
	// us its next bytes. While we work on what it sent, it owes nothing.
	waitingSince atomic.Int64
	// served is closed once its goroutine has begun reading from it. Until
	// then it had no chance to show progress, so it is never closed for a
	// newcomer; isServed is set with it.
	served   chan struct{}
	isServed atomic.Bool
	// midRecord: its bytes end inside a TLS record (encrypted mode);
	// midHello: part of its client hello has arrived, not all of it.
	midRecord, midHello atomic.Bool
	records             recordFraming // its goroutine's, for midRecord

	lastUseful atomic.Int64 // unix ns: promoted, or last received rows it was owed
	inPart     atomic.Bool  // receiving a part whose rows it is owed
}

// markUseful records that in is doing work its writer was owed.
func (in *inboundConn) markUseful(now time.Time) { in.lastUseful.Store(now.UnixNano()) }

// idleFor is how long in has gone without receiving rows it was owed.
func (in *inboundConn) idleFor(now time.Time) time.Duration {
	return now.Sub(time.Unix(0, in.lastUseful.Load()))
}

// stopped says whether in stopped mid-message: a writer sends each
// message of its hello whole, so only a stranger stays there.
func (in *inboundConn) stopped() bool { return in.midRecord.Load() || in.midHello.Load() }

// owesFor is how long we have waited for in's next bytes (0 while we are
// not waiting for it).
func (in *inboundConn) owesFor(now time.Time) time.Duration {
	since := in.waitingSince.Load()
	if since == 0 {
		return 0
	}
	return now.Sub(time.Unix(0, since))
}

// countingConn counts the bytes read from a raw connection, and checks
// the first against helloShape and the rest against the TLS record framing
// (encrypted mode), so admission can tell a writer mid-hello from a
// connection that never sent a byte, sent stray ones or stopped
// mid-message.
type countingConn struct {
	net.Conn
	in    *inboundConn
	shape helloShape
}

func (c countingConn) Read(b []byte) (int, error) {
	if c.in.isServed.CompareAndSwap(false, true) {
		close(c.in.served)
	}
	c.in.waitingSince.Store(time.Now().UnixNano())
	n, err := c.Conn.Read(b)
	c.in.waitingSince.Store(0)
	if n > 0 {
		if c.shape.encrypted {
			c.in.midRecord.Store(c.in.records.inside(b[:n]))
		}
	}
	defer c.in.bytesIn.Add(int64(n)) // after shaped: bytes counted are bytes checked
	if k := c.in.shaped.Load(); k >= 0 && int(k) < c.shape.len() {
		for _, x := range b[:n] {
			if int(k) == c.shape.len() {
				break
			}
			if !c.shape.fits(int(k), x) {
				k = -1
				break
			}
			k++
		}
		c.in.shaped.Store(k)
	}
	return n, err
}

// helloShape is how a writer's first bytes start: the plaintext client
// hello's magic and version, or (encrypted) a TLS handshake record that
// carries a ClientHello. Bytes that fit it are progress toward a hello;
// a stray byte is not.
type helloShape struct{ encrypted bool }

// len is how many first bytes the shape checks.
func (s helloShape) len() int {
	if s.encrypted {
		return 6 // record type, version u16, length u16, handshake type
	}
	return 5 // magic u32, version u8
}

// fits says whether b may be the i-th byte of a writer's hello.
func (s helloShape) fits(i int, b byte) bool {
	if !s.encrypted {
		if i < 4 {
			return b == byte(uint32(helloMagic)>>(8*i))
		}
		return b == protocolVersion
	}
	switch i {
	case 0:
		return b == 0x16 // handshake record
	case 1:
		return b == 0x03 // record version 3.x
	case 2:
		return b >= 0x01 && b <= 0x04
	case 5:
		return b == 0x01 // ClientHello
	}
	return true // the record's length
}

// recordFraming follows TLS record boundaries in the bytes a connection
// sends: a writer's TLS client writes whole records.
type recordFraming struct {
	header [5]byte // type, version u16, length u16
	got    int     // bytes of header read
	left   int     // bytes of the current record's body still to come
}

// inside consumes b and says whether the bytes so far end inside a record.
func (f *recordFraming) inside(b []byte) bool {
	for len(b) > 0 {
		if f.left > 0 {
			k := min(f.left, len(b))
			f.left, b = f.left-k, b[k:]
			continue
		}
		f.header[f.got], f.got, b = b[0], f.got+1, b[1:]
		if f.got == len(f.header) {
			f.left, f.got = int(binary.BigEndian.Uint16(f.header[3:])), 0
		}
	}
	return f.got > 0 || f.left > 0
}

// admission counts inbound connections by stage; t.mu guards it.
type admission struct {
	hello         []*inboundConn // in the hello, oldest first
	helloPerHost  map[string]int
	proven        int
	provenPerHost map[string]int
	provenPerPeer map[string]int
	provenGrace   time.Duration // provenGrace; tests change it
}

func newAdmission() admission {
	return admission{helloPerHost: map[string]int{}, provenPerHost: map[string]int{}, provenPerPeer: map[string]int{},
		provenGrace: provenGrace}
}

// inboundCounters count what happened to inbound connections and parts.
type inboundCounters struct {
	helloEvicted, helloRefused              atomic.Uint64
	helloFailed, overConnLimit              atomic.Uint64
	provenEvicted, owedNothingClosed        atomic.Uint64
	partsNotOwed, partsRefused, partsNoRoom atomic.Uint64
}

// InboundStats describe the receiving side of a Transport.
type InboundStats struct {
	HelloConns int   // connections in their hello now
	Conns      int   // connections that passed the hello, now
	HeldBytes  int64 // held for parts being received now (MaxHeldBytes at most)

	HelloEvicted  uint64 // connections closed in their hello to admit a newer one
	HelloRefused  uint64 // newcomers closed at once: we had not begun to serve any hello they could replace, or only one that sent each message whole
	HelloFailed   uint64 // hellos refused or not finished within HelloTimeout
	OverConnLimit uint64 // proven writers refused: MaxConns, MaxConnsPerHost or the per-writer bound reached, none idle
	ProvenEvicted uint64 // proven connections closed, idle (owed no rows) past provenGrace, to admit a newer one
	OwedNothing   uint64 // proven connections closed after sending parts while owed nothing for an IOTimeout
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
	st.HelloRefused = t.stats.helloRefused.Load()
	st.HelloFailed = t.stats.helloFailed.Load()
	st.OverConnLimit = t.stats.overConnLimit.Load()
	st.ProvenEvicted = t.stats.provenEvicted.Load()
	st.OwedNothing = t.stats.owedNothingClosed.Load()
	st.PartsNotOwed = t.stats.partsNotOwed.Load()
	st.PartsRefused = t.stats.partsRefused.Load()
	st.PartsNoRoom = t.stats.partsNoRoom.Load()
	return st
}

// admitHello registers a new connection in its hello, closing one in the
// hello from its IP, or from the IP with the most, to make room, and says
// whether it did; when every one that could make room was accepted so
// recently that we have not begun to serve it (we are that busy), or only
// one that sent each message whole could while another is not served yet,
// the newcomer is not registered; t.mu held.
func (t *Transport) admitHello(in *inboundConn) bool {
	a := &t.admit
	if a.helloPerHost[in.host] >= t.opts.MaxHelloConnsPerHost {
		why := fmt.Sprintf("%d connections from %s in their hello", a.helloPerHost[in.host], in.host)
		if !t.makeRoom(in, func(o *inboundConn) bool { return o.host == in.host }, why) {
			return false
		}
	}
	if len(a.hello) >= t.opts.MaxHelloConns {
		most := 0
		for _, n := range a.helloPerHost {
			most = max(most, n)
		}
		why := fmt.Sprintf("%d connections in their hello, %d from one IP", len(a.hello), most)
		if !t.makeRoom(in, func(o *inboundConn) bool { return a.helloPerHost[o.host] == most }, why) {
			return false
		}
	}
	a.hello = append(a.hello, in)
	a.helloPerHost[in.host]++
	return true
}

// makeRoom closes the hello connection evictionCandidate picks among those
// matching, or counts and logs in's refusal when it picks none; t.mu held.
func (t *Transport) makeRoom(in *inboundConn, match func(*inboundConn) bool, why string) bool {
	i := evictionCandidate(t.admit.hello, match, in.accepted)
	if i < 0 {
		t.stats.helloRefused.Add(1)
		t.logs.logf("connection refused: every hello just accepted",
			"%s refused: %s, not yet served or sending each message whole (at most %d, %d from one IP)", in.conn.RemoteAddr(), why,
			t.opts.MaxHelloConns, t.opts.MaxHelloConnsPerHost)
		return false
	}
	t.evictHello(i, why)
	return true
}

// evictionCandidate picks whom a newcomer displaces among the hello
// connections matching that we have begun to serve (hello is oldest
// first), or -1 for none: the one furthest from finishing a hello as a
// writer does, which sends each message whole and answers ours at once.
// First the oldest whose first bytes do not start a hello (helloShape);
// else the one stopped mid-message (the start of a record or of the client
// hello, not the rest) that we have waited longest to read from; else one
// that has not sent us a byte we read: the one we have waited longest to
// read from, then the oldest whose first bytes wait unread. A connection
// that sent every message whole (a writer waiting on its own round trip,
// or whose bytes we work on) is chosen last, and never while one matching
// is not served yet: then the newcomer is refused. Among those, the one
// we have waited longest to read from whose answer is not waiting unread,
// else the one that sent the fewest bytes, the oldest on a tie.
func evictionCandidate(hello []*inboundConn, match func(*inboundConn) bool, now time.Time) int {
	type candidate struct {
		i    int
		owes time.Duration
	}
	stopped, silent, silentUnread, unserved := -1, -1, -1, false
	var owing, busy []candidate
	for i, o := range hello {
		switch {
		case !match(o):
		case !o.isServed.Load():
			unserved = true
		case o.shaped.Load() < 0:
			return i // the oldest stray: a writer's bytes start a hello
		case o.stopped():
			if stopped < 0 || o.owesFor(now) > hello[stopped].owesFor(now) {
				stopped = i
			}
		case o.bytesIn.Load() == 0:
			if pendingBytes(o.conn) > 0 {
				if silentUnread < 0 {
					silentUnread = i
				}
			} else if silent < 0 || o.owesFor(now) > hello[silent].owesFor(now) {
				silent = i
			}
		case o.owesFor(now) > 0:
			owing = append(owing, candidate{i, o.owesFor(now)})
		default:
			busy = append(busy, candidate{i: i})
		}
	}
	switch {
	case stopped >= 0:
		return stopped
	case silent >= 0:
		return silent
	case silentUnread >= 0:
		return silentUnread
	case unserved:
		return -1 // it may be a stranger's: never close a writer's progress for it
	}
	slices.SortStableFunc(owing, func(a, b candidate) int { return cmp.Compare(b.owes, a.owes) })
	for _, c := range owing {
		if pendingBytes(hello[c.i].conn) == 0 {
			return c.i
		}
		busy = append(busy, c)
	}
	pick := -1
	for _, c := range busy {
		if pick < 0 || hello[c.i].bytesIn.Load() < hello[pick].bytesIn.Load() ||
			hello[c.i].bytesIn.Load() == hello[pick].bytesIn.Load() && c.i < pick {
			pick = c.i
		}
	}
	return pick
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

// promote moves in from its hello to the proven writers, closing an idle
// proven connection to make room where a bound is reached, or says why it
// may not write ("" when promoted); t.mu held.
func (t *Transport) promote(in *inboundConn) string {
	if in.stage != stageHello {
		return "closed during its hello"
	}
	t.leaveHello(in)
	in.stage = stageGone // unless promoted below
	a := &t.admit
	perPeer := connsPerStream * t.opts.Streams
	for _, bound := range []struct {
		full  bool
		match func(*inboundConn) bool
		why   string
	}{
		{a.provenPerPeer[in.peerID] >= perPeer, func(o *inboundConn) bool { return o.peerID == in.peerID },
			fmt.Sprintf("%d data connections of %s already", a.provenPerPeer[in.peerID], in.peerID)},
		{a.provenPerHost[in.host] >= t.opts.MaxConnsPerHost, func(o *inboundConn) bool { return o.host == in.host },
			fmt.Sprintf("%d data connections from %s already", a.provenPerHost[in.host], in.host)},
		{a.proven >= t.opts.MaxConns, func(*inboundConn) bool { return true },
			fmt.Sprintf("%d data connections already", a.proven)},
	} {
		if bound.full && !t.evictIdleProven(bound.match, bound.why) {
			return bound.why
		}
	}
	in.stage = stageProven
	in.markUseful(time.Now())
	a.proven++
	a.provenPerHost[in.host]++
	a.provenPerPeer[in.peerID]++
	return ""
}

// evictIdleProven closes the matching proven connection that has gone
// longest without receiving rows it was owed, if longer than provenGrace
// and not receiving a part, and says whether it did; t.mu held.
func (t *Transport) evictIdleProven(match func(*inboundConn) bool, why string) bool {
	now := time.Now()
	var pick *inboundConn
	for _, o := range t.inbound {
		if o.stage != stageProven || !match(o) || o.inPart.Load() || o.idleFor(now) < t.admit.provenGrace {
			continue
		}
		if pick == nil || o.idleFor(now) > pick.idleFor(now) {
			pick = o
		}
	}
	if pick == nil {
		return false
	}
	t.leaveProven(pick)
	pick.stage = stageEvicted
	_ = pick.conn.Close()
	t.stats.provenEvicted.Add(1)
	t.logs.logf("idle data connection closed for a newer one",
		"closed %s of %s, owed no rows for %v: %s (at most %d, %d from one IP, %d from one writer)",
		pick.conn.RemoteAddr(), pick.peerID, pick.idleFor(now).Round(time.Millisecond), why,
		t.opts.MaxConns, t.opts.MaxConnsPerHost, connsPerStream*t.opts.Streams)
	return true
}

// leaveProven removes in from the proven writers' counts; t.mu held.
func (t *Transport) leaveProven(in *inboundConn) {
	a := &t.admit
	a.proven--
	if a.provenPerHost[in.host]--; a.provenPerHost[in.host] <= 0 {
		delete(a.provenPerHost, in.host)
	}
	if a.provenPerPeer[in.peerID]--; a.provenPerPeer[in.peerID] <= 0 {
		delete(a.provenPerPeer, in.peerID)
	}
}

// leave forgets in at the end of its goroutine; t.mu held.
func (t *Transport) leave(in *inboundConn) {
	switch in.stage {
	case stageHello:
		t.leaveHello(in)
	case stageProven:
		t.leaveProven(in)
	}
	in.stage = stageGone
}

func remoteHost(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	return c.RemoteAddr().String()
}

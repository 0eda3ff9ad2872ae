package tcpdata

import (
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/data"
)

// Connections still in their hello have a budget of their own: beyond it
// the oldest of them (from that IP, else at all) is closed, so a newcomer
// always gets in. Writers that passed the hello have theirs: beyond it a
// hello is refused as busy.
func TestInboundConnectionsAreBounded(t *testing.T) {
	var logs logTap
	tr, err := New(Options{
		LocalID: "127.0.0.1:1", Region: data.Region{Mem: make([]byte, 4*rowLen), RowLen: rowLen},
		ListenHost: "127.0.0.1", MaxHelloConns: 5, MaxHelloConnsPerHost: 3, MaxConns: 8, MaxConnsPerHost: 1,
		Logf: logs.logf,
	})
	require.NoError(t, err)
	defer tr.Close()
	tr.mu.Lock()
	tr.admit.provenGrace = time.Hour // the first writer's connection is never idle enough to give way
	tr.mu.Unlock()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	dial := func(ip string, n int) {
		for range n {
			c := dialFrom(t, ip, tr.DataAddr())
			_ = c.SetReadDeadline(time.Now().Add(waitLimit))
			_, err := io.ReadFull(c, make([]byte, serverHelloLen))
			require.NoError(t, err, "every newcomer gets the server hello")
			conns = append(conns, c)
			// "Oldest" is who we waited longest to read from: let the
			// server begin waiting on this one before the next is dialed.
			require.Eventually(t, func() bool {
				tr.mu.Lock()
				defer tr.mu.Unlock()
				h := tr.admit.hello
				return len(h) > 0 && h[len(h)-1].waitingSince.Load() != 0
			}, waitLimit, time.Millisecond)
		}
	}
	closed := func() []bool {
		var out []bool
		for _, c := range conns {
			_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
			_, err := c.Read(make([]byte, 1))
			out = append(out, err != nil && !strings.Contains(err.Error(), "timeout"))
		}
		return out
	}

	dial("127.0.0.1", 5)
	assert.Equal(t, []bool{true, true, false, false, false}, closed(), "the two oldest from the IP made room")
	dial("127.0.0.2", 3)
	assert.Equal(t, []bool{true, true, true, false, false, false, false, false}, closed(),
		"the oldest of all made room for the sixth in the hello")
	st := tr.InboundStats()
	assert.Equal(t, 5, st.HelloConns)
	assert.EqualValues(t, 3, st.HelloEvicted)
	logs.waitFor(t, "closed in its hello for a newer one")
	assert.Equal(t, 1, logs.count("closed in its hello"), "one line for three evictions: the log is rate-limited per cause")

	// One writer from 127.0.0.1 passes its hello; a second from there is
	// refused as busy, and the idle hellos took neither's place.
	src := randomRegion(t, 4)
	for i, id := range []string{"w1", "w2"} {
		w := newTransport(t, id, src, func(o *Options) { o.Streams = 1 })
		addPeer(t, w, "b", tr)
		_, err := w.Write("b", []uint64{0}, []uint64{uint64(i)})
		require.NoError(t, err)
		if c := nextCompletion(t, w, waitLimit); i == 0 {
			require.NoError(t, c.Err)
		} else {
			require.ErrorIs(t, c.Err, ErrBusy)
			assert.Contains(t, c.Err.Error(), "1 data connections from 127.0.0.1 already")
		}
	}
	st = tr.InboundStats()
	assert.Equal(t, 1, st.Conns)
	assert.EqualValues(t, 1, st.OverConnLimit)
}

// releasedMidway accepts a transfer's rows at its header, then finds row 3
// released (its load ended) by the time that row's bytes arrived.
type releasedMidway struct{}

func (releasedMidway) MayWrite(string, uint64) bool { return true }
func (releasedMidway) WriteRow(_ string, row uint64, dst, src []byte) bool {
	if row == 3 {
		return false
	}
	copy(dst, src)
	return true
}

// A row whose load ended while it streamed in never lands, nor do the rows
// after it; the connection stays usable.
func TestARowArrivingAfterItsLoadEndedNeverLands(t *testing.T) {
	src, dst := randomRegion(t, 8), sentinelRegion(8)
	a := newTransport(t, "a", src, nil)
	b := newTransport(t, "b", dst, func(o *Options) { o.Guard = releasedMidway{} })
	addPeer(t, a, "b", b)
	_, err := a.Write("b", seq(0, 6), seq(0, 6))
	require.NoError(t, err)
	c := nextCompletion(t, a, waitLimit)
	require.ErrorIs(t, c.Err, data.ErrRejected)
	assert.Contains(t, c.Err.Error(), "row 3")
	assertRowsAt(t, src, dst, []uint64{0, 1, 2}, []uint64{0, 1, 2})

	_, err = a.Write("b", []uint64{7}, []uint64{7})
	require.NoError(t, err)
	require.NoError(t, nextCompletion(t, a, waitLimit).Err)
}

// Fence cuts a writer's transfer under way: when it returns, none of that
// transfer's rows can land any more.
func TestFenceCutsWritesUnderWay(t *testing.T) {
	src, dst := randomRegion(t, 8), sentinelRegion(8)
	inGuard, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	a := newTransport(t, "a", src, nil)
	b := newTransport(t, "b", dst, func(o *Options) {
		o.Guard = data.GuardFunc(func(string, uint64) bool {
			once.Do(func() { close(inGuard); <-release }) // the part's header is being checked
			return true
		})
	})
	addPeer(t, a, "b", b)
	_, err := a.Write("b", seq(0, 4), seq(0, 4))
	require.NoError(t, err)
	select {
	case <-inGuard:
	case <-time.After(5 * time.Second):
		close(release)
		t.Fatal("the transfer never reached the receiver's guard")
	}
	fenced := make(chan struct{})
	go func() { b.Fence("a"); close(fenced) }()
	time.Sleep(50 * time.Millisecond)
	close(release)
	select {
	case <-fenced:
	case <-time.After(5 * time.Second):
		t.Fatal("Fence did not return")
	}
	require.Error(t, nextCompletion(t, a, waitLimit).Err, "the cut transfer fails")
	assertRowsAt(t, src, dst, nil, nil)
}

// With RequireGrant only the session the receiver granted may write, and
// only while it lasts: no token, another peer's token or a revoked one are
// refused, and revoking cuts the connections it opened.
func TestOnlyTheGrantedSessionMayWrite(t *testing.T) {
	src, dst := randomRegion(t, 8), sentinelRegion(8)
	b := newTransport(t, "b", dst, func(o *Options) { o.RequireGrant = true })
	write := func(from *Transport) error {
		_, err := from.Write("b", []uint64{1}, []uint64{2})
		require.NoError(t, err)
		return nextCompletion(t, from, waitLimit).Err
	}
	join := func(id, token string) *Transport {
		a := newTransport(t, id, src, nil)
		require.NoError(t, a.AddPeer("b", data.PeerInfo{RowLen: src.RowLen, DataAddr: b.DataAddr(),
			Grants: data.Grants{DataToken: token}}))
		return a
	}

	require.ErrorIs(t, write(join("a", "")), ErrAuthFailed, "no token")
	var ga, gc data.Grants
	b.Grant("a", &ga)
	b.Grant("c", &gc)
	require.ErrorIs(t, write(join("a", gc.DataToken)), ErrAuthFailed, "another peer's token")
	require.ErrorIs(t, write(join("x", ga.DataToken)), ErrAuthFailed, "a's token named by x")
	a := join("a", ga.DataToken)
	require.NoError(t, write(a), "the granted session writes")
	assertRowsAt(t, src, dst, []uint64{1}, []uint64{2})

	b.Revoke("a", ga) // a's session ended
	require.Error(t, write(a), "its connection was cut and its token no longer opens one")
	var ga2 data.Grants
	b.Grant("a", &ga2)
	require.NoError(t, write(join("a", ga2.DataToken)), "a's next session writes with its own token")
}

// splitGuard holds row 4 (in the second part) until released, and refuses
// row 0 (in the first) once row 4 is held, so the first part fails while
// the second is on the wire.
type splitGuard struct {
	holding chan struct{}
	release chan struct{}
	once    sync.Once
}

func (g *splitGuard) MayWrite(string, uint64) bool { return true }
func (g *splitGuard) WriteRow(_ string, row uint64, dst, src []byte) bool {
	switch row {
	case 0:
		select {
		case <-g.holding:
		case <-time.After(5 * time.Second):
		}
		return false
	case 4:
		g.once.Do(func() { close(g.holding) })
		<-g.release
	}
	copy(dst, src)
	return true
}

// A transfer whose first part failed is reported only once its other part
// stopped writing: the consumer hands the rows back when told it failed.
func TestAFailedTransferIsReportedOnlyOnceNoPartWrites(t *testing.T) {
	src, dst := randomRegion(t, 8), sentinelRegion(8)
	g := &splitGuard{holding: make(chan struct{}), release: make(chan struct{})}
	a := newTransport(t, "a", src, nil)
	b := newTransport(t, "b", dst, func(o *Options) { o.Guard = g })
	addPeer(t, a, "b", b)
	var releaseOnce sync.Once
	release := func() { releaseOnce.Do(func() { close(g.release) }) }
	defer release() // never leave the receiver blocked, even when failing
	_, err := a.Write("b", seq(0, 8), seq(0, 8))
	require.NoError(t, err)
	select {
	case <-g.holding:
	case <-time.After(5 * time.Second):
		t.Fatal("the second part never reached the receiver")
	}
	select {
	case c := <-a.Completions():
		release()
		t.Fatalf("reported (%v) while the second part still writes", c.Err)
	case <-time.After(300 * time.Millisecond):
	}
	release()
	require.Error(t, nextCompletion(t, a, waitLimit).Err)
}

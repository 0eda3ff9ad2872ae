package tcpdata

import (
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/data"
)

// Connections that never say hello cannot exhaust the receiver: beyond the
// per-host bound they are closed at once, and a writer from another
// address still gets in.
func TestInboundConnectionsAreBounded(t *testing.T) {
	var mu sync.Mutex
	var logs []string
	tr, err := New(Options{
		LocalID: "127.0.0.1:1", Region: data.Region{Mem: make([]byte, 4*64), RowLen: 64},
		ListenHost: "127.0.0.1", MaxConns: 8, MaxConnsPerHost: 3,
		Logf: func(f string, a ...any) { mu.Lock(); logs = append(logs, f); mu.Unlock() },
	})
	require.NoError(t, err)
	defer tr.Close()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	for range 5 {
		c, err := net.Dial("tcp", tr.DataAddr())
		require.NoError(t, err)
		conns = append(conns, c)
	}
	closed := 0
	for _, c := range conns {
		_ = c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		buf := make([]byte, 64)
		if _, err := c.Read(buf); err != nil && !strings.Contains(err.Error(), "timeout") {
			closed++ // refused: closed without a hello
		}
	}
	assert.Equal(t, 2, closed, "two over the per-host bound of 3")
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.2")}}
	other, err := d.Dial("tcp", tr.DataAddr())
	require.NoError(t, err)
	defer other.Close()
	_ = other.SetReadDeadline(time.Now().Add(time.Second))
	n, err := other.Read(make([]byte, 8))
	require.NoError(t, err, "another source still gets the server hello")
	assert.Positive(t, n)
	mu.Lock()
	defer mu.Unlock()
	assert.Contains(t, strings.Join(logs, "\n"), "refused: %s")
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

package multipath

import (
	"bytes"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/data/memdata"
	"github.com/peerkv/peerkv/core/data/tcpdata"
)

const rowLen = 4096

// fakeNixl stands in for the NIXL path: an in-memory path that advertises
// agent metadata, as NIXL does, and can refuse peers.
type fakeNixl struct {
	*memdata.Transport
	refuse error
}

func (f *fakeNixl) Name() string          { return "nixl" }
func (f *fakeNixl) AgentMetadata() []byte { return []byte("agent-md") }
func (f *fakeNixl) AddPeer(id string, info data.PeerInfo) error {
	if f.refuse != nil {
		return f.refuse
	}
	return f.Transport.AddPeer(id, info)
}

// fakeShm stands in for the same-host path: an in-memory path that grants
// offers (data.Granter) and takes only peers that made one.
type fakeShm struct {
	*memdata.Transport
	withdrawn []string
}

func (f *fakeShm) Name() string                        { return "shm" }
func (f *fakeShm) Offer(peerID string) string          { return "v1 grant-for " + peerID }
func (f *fakeShm) Grant(peerID string, g *data.Grants) { g.SameHost = f.Offer(peerID) }
func (f *fakeShm) Revoke(peerID string, g data.Grants) {
	f.withdrawn = append(f.withdrawn, peerID+" "+g.SameHost)
}

// end is one peer: its region, its fake same-host and NIXL paths and its
// TCP path.
type end struct {
	id     string
	region data.Region
	shm    *fakeShm
	nixl   *fakeNixl
	tcp    *tcpdata.Transport
}

func newEnd(t *testing.T, hub *memdata.Hub, id string) *end {
	t.Helper()
	return newEndOfRows(t, hub, id, 8)
}

// newEndOfRows is newEnd over a region of numRows rows.
func newEndOfRows(t testing.TB, hub *memdata.Hub, id string, numRows int) *end {
	t.Helper()
	region := data.Region{Mem: make([]byte, numRows*rowLen), RowLen: rowLen}
	tcp, err := tcpdata.New(tcpdata.Options{LocalID: id, Region: region, ListenHost: "127.0.0.1"})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tcp.Close() })
	return &end{id: id, region: region, shm: &fakeShm{Transport: hub.Transport(id, region, nil)},
		nixl: &fakeNixl{Transport: hub.Transport(id, region, nil)}, tcp: tcp}
}

// info is what e's connect would advertise with the given paths.
func (e *end) info(nixl, tcp bool) data.PeerInfo {
	info := data.PeerInfo{BaseAddr: e.region.BaseAddr(), NumRows: e.region.NumRows(), RowLen: rowLen}
	if nixl {
		info.AgentMetadata = e.nixl.AgentMetadata()
	}
	if tcp {
		info.DataAddr = e.tcp.DataAddr()
	}
	return info
}

// newMultipath combines paths for one test; Close runs at its end.
func newMultipath(t *testing.T, missing string, paths ...data.Transport) *Transport {
	t.Helper()
	tr, err := New(missing, paths...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

func fill(r data.Region, row uint64, b byte) {
	for i := range r.Row(row) {
		r.Row(row)[i] = b
	}
}

func completion(t testing.TB, tr data.Transport) data.Completion {
	t.Helper()
	select {
	case c := <-tr.Completions():
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no completion within 10s")
		return data.Completion{}
	}
}

// writeRow writes row 1 of from's region into row 5 of to's and waits.
func writeRow(t *testing.T, tr data.Transport, from, to *end) {
	t.Helper()
	fill(from.region, 1, 0xA7)
	id, err := tr.Write(to.id, []uint64{1}, []uint64{5})
	require.NoError(t, err)
	c := completion(t, tr)
	require.NoError(t, c.Err)
	assert.Equal(t, id, c.ID, "the completion carries the id Write returned")
	assert.Equal(t, to.id, c.PeerID)
	assert.True(t, bytes.Equal(from.region.Row(1), to.region.Row(5)), "row arrived intact")
}

func TestPrefersTheFirstPathBothSidesHave(t *testing.T) {
	hub := memdata.NewHub()
	a, b := newEnd(t, hub, "a:1"), newEnd(t, hub, "b:1")
	tr := newMultipath(t, "", a.nixl, a.tcp)

	assert.Equal(t, "nixl+tcp", tr.Name())
	assert.Equal(t, []byte("agent-md"), tr.AgentMetadata())
	assert.Equal(t, a.tcp.DataAddr(), tr.DataAddr())

	require.NoError(t, tr.AddPeer(b.id, b.info(true, true)))
	assert.Equal(t, "nixl", tr.PathTo(b.id))
	writeRow(t, tr, a, b)
}

func TestSameHostOfferPicksShmAndGrantsAreForwarded(t *testing.T) {
	hub := memdata.NewHub()
	a, b, c := newEnd(t, hub, "a:1"), newEnd(t, hub, "b:1"), newEnd(t, hub, "c:1")
	tr := newMultipath(t, "", a.shm, a.nixl, a.tcp)
	assert.Equal(t, "shm+nixl+tcp", tr.Name())

	var g data.Grants
	tr.Grant(b.id, &g)
	assert.Equal(t, "v1 grant-for b:1", g.SameHost, "the same-host path's grant goes into our connect")
	assert.Len(t, g.DataToken, 32, "and the TCP path's data token")
	tr.Revoke(b.id, g)
	assert.Equal(t, []string{"b:1 v1 grant-for b:1"}, a.shm.withdrawn)

	withOffer := b.info(true, true)
	withOffer.SameHost = b.shm.Offer(a.id)
	require.NoError(t, tr.AddPeer(b.id, withOffer))
	assert.Equal(t, "shm", tr.PathTo(b.id))
	writeRow(t, tr, a, b)

	require.NoError(t, tr.AddPeer(c.id, c.info(true, true)), "a peer without an offer (another host)")
	assert.Equal(t, "nixl", tr.PathTo(c.id))
	assert.Empty(t, tr.Refused(c.id), "shm was not offered, so not refused")
}

func TestWithoutAGrantingPathThereIsNoOffer(t *testing.T) {
	hub := memdata.NewHub()
	a, b := newEnd(t, hub, "a:1"), newEnd(t, hub, "b:1")
	tr := newMultipath(t, "", a.nixl, a.tcp)
	var g data.Grants
	tr.Grant(b.id, &g)
	assert.Empty(t, g.SameHost, "no same-host path, no same-host grant")
	tr.Revoke(b.id, data.Grants{SameHost: "v1 anything"}) // nothing to forward to: a no-op
}

func TestPeerOfferingOnlyTCPGetsTCP(t *testing.T) {
	hub := memdata.NewHub()
	a, b := newEnd(t, hub, "a:1"), newEnd(t, hub, "b:1")
	tr := newMultipath(t, "", a.nixl, a.tcp)

	require.NoError(t, tr.AddPeer(b.id, b.info(false, true)))
	assert.Equal(t, "tcp", tr.PathTo(b.id))
	assert.Empty(t, tr.Refused(b.id), "a path the peer does not offer was not refused")
	writeRow(t, tr, a, b)
}

func TestFailingPathFallsThroughToTheNext(t *testing.T) {
	hub := memdata.NewHub()
	a, b := newEnd(t, hub, "a:1"), newEnd(t, hub, "b:1")
	a.nixl.refuse = errors.New("loadRemoteMD failed")
	tr := newMultipath(t, "", a.nixl, a.tcp)

	require.NoError(t, tr.AddPeer(b.id, b.info(true, true)))
	assert.Equal(t, "tcp", tr.PathTo(b.id))
	assert.Equal(t, "nixl: loadRemoteMD failed", tr.Refused(b.id), "why the preferred path is idle")
	writeRow(t, tr, a, b)
}

func TestNoSharedPathNamesEveryReason(t *testing.T) {
	hub := memdata.NewHub()
	a, b := newEnd(t, hub, "a:1"), newEnd(t, hub, "b:1")
	tr := newMultipath(t, "NIXL unavailable: libnixl_capi.so not found", a.tcp)

	err := tr.AddPeer(b.id, b.info(true, false)) // a stock vLLM peer: NIXL only
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no data path shared with peer b:1")
	assert.Contains(t, err.Error(), "the peer offers no tcp path")
	assert.Contains(t, err.Error(), "NIXL unavailable: libnixl_capi.so not found")
	assert.Equal(t, "", tr.PathTo(b.id))
	_, err = tr.Write(b.id, []uint64{0}, []uint64{0})
	assert.ErrorIs(t, err, data.ErrUnknownPeer)
}

func TestRemovedPeerCannotBeWritten(t *testing.T) {
	hub := memdata.NewHub()
	a, b := newEnd(t, hub, "a:1"), newEnd(t, hub, "b:1")
	tr := newMultipath(t, "", a.nixl, a.tcp)

	require.NoError(t, tr.AddPeer(b.id, b.info(true, true)))
	tr.RemovePeer(b.id)
	_, err := tr.Write(b.id, []uint64{0}, []uint64{0})
	assert.ErrorIs(t, err, data.ErrUnknownPeer)
}

func TestIDsStayDistinctAcrossPaths(t *testing.T) {
	hub := memdata.NewHub()
	a, b, c := newEnd(t, hub, "a:1"), newEnd(t, hub, "b:1"), newEnd(t, hub, "c:1")
	tr := newMultipath(t, "", a.nixl, a.tcp)
	require.NoError(t, tr.AddPeer(b.id, b.info(true, true)))  // nixl
	require.NoError(t, tr.AddPeer(c.id, c.info(false, true))) // tcp

	ids := map[uint64]string{}
	for round := range uint64(4) {
		for _, to := range []string{b.id, c.id} {
			// A row of its own per transfer: concurrent writes never share one.
			id, err := tr.Write(to, []uint64{0}, []uint64{round})
			require.NoError(t, err)
			require.NotContains(t, ids, id, "transfer ids must be unique across paths")
			ids[id] = to
		}
	}
	for range ids {
		got := completion(t, tr)
		require.NoError(t, got.Err)
		want, ok := ids[got.ID]
		require.True(t, ok, "completion %d was never issued, or reported twice", got.ID)
		assert.Equal(t, want, got.PeerID)
		delete(ids, got.ID)
	}
}

func TestCloseEndsCompletions(t *testing.T) {
	hub := memdata.NewHub()
	a := newEnd(t, hub, "a:1")
	tr := newMultipath(t, "", a.nixl, a.tcp)
	require.NoError(t, tr.Close())
	require.NoError(t, tr.Close(), "Close is idempotent")
	select {
	case _, ok := <-tr.Completions():
		assert.False(t, ok)
	case <-time.After(5 * time.Second):
		t.Fatal("Completions not closed after Close")
	}
}

func TestAPathThatCannotReachThePeerIsNoWarning(t *testing.T) {
	hub := memdata.NewHub()
	a, b := newEnd(t, hub, "a:1"), newEnd(t, hub, "b:1")
	a.nixl.refuse = fmt.Errorf("%w: the peer is on another host", data.ErrNotReachable)
	tr := newMultipath(t, "", a.nixl, a.tcp)
	require.NoError(t, tr.AddPeer(b.id, b.info(true, true)))
	assert.Equal(t, "tcp", tr.PathTo(b.id))
	assert.Empty(t, tr.Refused(b.id), "a path that cannot reach the peer from here is expected, not refused")
}

// cancelTap records the cancels a path receives.
type cancelTap struct {
	*fakeNixl
	canceled []string
}

func (c *cancelTap) Cancel(peerID string, id uint64) {
	c.canceled = append(c.canceled, fmt.Sprintf("%s/%d", peerID, id))
}

// A cancel reaches the path that runs the transfer, under that path's own
// id; a path that cannot cancel is skipped.
func TestCancelReachesThePathOfTheTransfer(t *testing.T) {
	hub := memdata.NewHub()
	a, b, c := newEnd(t, hub, "a:1"), newEnd(t, hub, "b:1"), newEnd(t, hub, "c:1")
	tap := &cancelTap{fakeNixl: a.nixl}
	tr := newMultipath(t, "", a.shm, tap, a.tcp)
	require.NoError(t, tr.AddPeer(b.id, b.info(true, true)))  // the tapped path
	require.NoError(t, tr.AddPeer(c.id, c.info(false, true))) // tcp

	toB, err := tr.Write(b.id, []uint64{0}, []uint64{1})
	require.NoError(t, err)
	var canceler data.Canceler = tr
	canceler.Cancel(b.id, toB)
	require.Equal(t, []string{fmt.Sprintf("%s/%d", b.id, toB>>indexBits)}, tap.canceled)
	canceler.Cancel(b.id, toB&^(1<<indexBits-1)) // index 0: the shm path, which cannot cancel
	require.Len(t, tap.canceled, 1)
	require.NoError(t, completion(t, tr).Err)
}

// silentPath is a path that cannot say whether it lets writes around the
// guard (no data.Unguarded).
type silentPath struct{ data.Transport }

// multipath lets writes around the guard when any of its paths does, or
// cannot say.
func TestWritesAroundTheGuardIfAnyPathDoes(t *testing.T) {
	hub := memdata.NewHub()
	region := data.Region{Mem: make([]byte, rowLen), RowLen: rowLen}
	allow := data.GuardFunc(func(string, uint64) bool { return true })
	guarded := func() data.Transport { return hub.Transport("g", region, allow) }
	for name, c := range map[string]struct {
		paths []data.Transport
		want  bool
	}{
		"all guarded":    {[]data.Transport{guarded()}, false},
		"one around":     {[]data.Transport{hub.Transport("a", region, nil), guarded()}, true},
		"one cannot say": {[]data.Transport{silentPath{guarded()}, guarded()}, true},
	} {
		t.Run(name, func(t *testing.T) {
			mp, err := New("", c.paths...)
			require.NoError(t, err)
			defer mp.Close()
			assert.Equal(t, c.want, mp.WritesUnguarded())
		})
	}
}

package tier

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/params"
	"github.com/peerkv/peerkv/core/session"
)

// fakeSource plays the session to one source: it answers lookups from
// hits (a key absent is not answered yet), or none while unanswered (a
// new round), and records what the book asks.
type fakeSource struct {
	id         string
	dead       bool
	hits       map[string]bool
	unanswered bool
	round      uint64
	fetches    []fakeFetch
	aborted    []uint64
	flushed    int
}

type fakeFetch struct {
	jobID int64
	kv    string
	rows  []uint64
	round uint64
}

func (f *fakeSource) PeerID() string               { return f.id }
func (f *fakeSource) Dead() bool                   { return f.dead }
func (f *fakeSource) Ready() bool                  { return !f.dead }
func (f *fakeSource) ReserveLookups(string, int)   {}
func (f *fakeSource) FlushLookup(string)           { f.flushed++ }
func (f *fakeSource) EndLookup(string) bool        { return false }
func (f *fakeSource) FinishConsumer(string)        {}
func (f *fakeSource) AbortLoad(_ string, r uint64) { f.aborted = append(f.aborted, r) }
func (f *fakeSource) RegisterLookup(kv string, key []byte) (bool, bool) {
	if f.unanswered {
		return false, false
	}
	return f.Probed(kv, key)
}
func (f *fakeSource) Probed(_ string, key []byte) (hit, known bool) {
	hit, known = f.hits[string(key)]
	return hit, known
}

func (f *fakeSource) RequestBlocks(jobID int64, kv string, _ [][]byte, rows []uint64) uint64 {
	r := f.round
	f.round++
	f.fetches = append(f.fetches, fakeFetch{jobID: jobID, kv: kv, rows: rows, round: r})
	return r
}

type jobOutcome struct {
	jobID int64
	ok    bool
}

// bookRig plays the coordinator for one pull book: sessions by peer id, a
// clock the test moves, and the jobs reported.
type bookRig struct {
	t        *testing.T
	book     *pullBook
	now      time.Time
	closed   bool
	sessions map[string]*fakeSource
	reported []jobOutcome
	news     int
}

const rigLoadTimeout = 10 * time.Second

func newBookRig(t *testing.T) *bookRig {
	rig := &bookRig{t: t, now: time.Unix(1_790_000_000, 0), sessions: map[string]*fakeSource{}}
	rig.book = newPullBook(bookHooks{
		now:    func() time.Time { return rig.now },
		closed: func() bool { return rig.closed },
		sessionFor: func(peerID string) (sourceSession, error) {
			s := rig.sessions[peerID]
			if s == nil {
				return nil, fmt.Errorf("no session to %s", peerID)
			}
			return s, nil
		},
		report:      func(jobID int64, ok bool, _ int64) { rig.reported = append(rig.reported, jobOutcome{jobID, ok}) },
		fence:       func(string) {},
		fetched:     func(session.Report, int64, time.Duration) {},
		answersNews: func(bool) { rig.news++ },
		logf:        func(string, string, ...any) {},
	}, rigLoadTimeout, 4, 64, 64, true)
	return rig
}

// source adds a live session to peer host:port and returns the source
// naming it under kv.
func (rig *bookRig) source(port int, kv string) (params.Source, *fakeSource) {
	src := params.Source{KVRequestID: kv, Host: "10.0.0.1", Port: port, Probe: true}
	s := &fakeSource{id: src.PeerID(), hits: map[string]bool{}}
	rig.sessions[s.id] = s
	return src, s
}

// cachedRequest starts reqID pulling from sources, its host caching answers.
func (rig *bookRig) cachedRequest(reqID string, sources ...params.Source) *pull {
	require.True(rig.t, rig.book.start(reqID, nil, sources))
	require.Equal(rig.t, LookupsAsk, rig.book.lookupMode(reqID))
	return rig.book.request(reqID).pull
}

// A peer may write only the rows it is owed; releasing them takes them
// back; a row given to another peer moves; what a peer is owed never goes
// negative and a peer owed nothing leaves no entry.
func TestGuardCountsTheRowsEachPeerIsOwed(t *testing.T) {
	g := newRowGuard(0, false)
	var _ data.WriteGuard = g
	var _ data.OwedRows = g
	dst, src := make([]byte, 2), []byte{7, 7}

	g.expect("a", []uint64{1, 2, 3}, true)
	g.expect("a", []uint64{3}, true) // already a's: not counted twice
	assert.Equal(t, 3, g.RowsOwed("a"))
	assert.True(t, g.MayWrite("a", 1))
	assert.False(t, g.MayWrite("b", 1), "a row is written only by the peer it is owed to")
	assert.False(t, g.MayWrite("a", 9), "a row no load expects is written by nobody")
	assert.False(t, g.WriteRow("b", 2, dst, src))
	assert.Equal(t, []byte{0, 0}, dst, "a refused write copies nothing")

	g.expect("b", []uint64{3, 4}, true) // row 3 moves to b
	assert.Equal(t, 2, g.RowsOwed("a"))
	assert.Equal(t, 2, g.RowsOwed("b"))
	assert.False(t, g.MayWrite("a", 3))

	g.expect("a", []uint64{1, 2, 3}, false) // 3 is b's: a cannot release it
	assert.Equal(t, 0, g.RowsOwed("a"))
	assert.Equal(t, 2, g.RowsOwed("b"))
	assert.NotContains(t, g.owed, "a", "a peer owed nothing leaves no entry")
	assert.False(t, g.WriteRow("a", 1, dst, src), "released rows are no longer written")

	g.expect("a", []uint64{1, 2}, false) // released twice: never below zero
	g.expect("c", []uint64{3, 4}, false) // never owed them
	assert.Equal(t, 0, g.RowsOwed("a"))
	assert.NotContains(t, g.owed, "a")
	assert.NotContains(t, g.owed, "c")
	assert.True(t, g.WriteRow("b", 4, dst, src))
	assert.Equal(t, src, dst)

	g.expect("b", []uint64{3, 4}, false)
	assert.Empty(t, g.owed, "every entry goes at zero")
	assert.Empty(t, g.expected)
	assert.Equal(t, 0, g.rowsExpected())
}

// Poisoning takes every row back at once.
func TestRowGuardRevokeAllTakesEveryRowBack(t *testing.T) {
	g := newRowGuard(0, false)
	g.expect("a", []uint64{1, 2}, true)
	g.expect("b", []uint64{3}, true)
	g.revokeAll()
	assert.False(t, g.MayWrite("a", 1))
	assert.False(t, g.MayWrite("b", 3))
	assert.Equal(t, 0, g.RowsOwed("a"))
	assert.Empty(t, g.owed)
}

// A session's end marks stale exactly the pulls with a source it served,
// whatever kv id they use, and no other.
func TestPurgeMarksStaleExactlyThePullsUsingTheSession(t *testing.T) {
	rig := newBookRig(t)
	srcA, a := rig.source(1, "kv-a")
	srcB, _ := rig.source(2, "kv-b")
	srcA2 := srcA
	srcA2.KVRequestID = "kv-other" // the same session under another kv id
	onlyA := rig.cachedRequest("r1", srcA)
	onlyB := rig.cachedRequest("r2", srcB)
	both := rig.cachedRequest("r3", srcB, srcA2)
	require.True(t, rig.book.start("uncached", nil, []params.Source{srcA}))
	uncached := rig.book.request("uncached").pull

	rig.book.purge(a)
	assert.ElementsMatch(t, []*pull{onlyA, both}, rig.book.stale)
	assert.True(t, onlyA.told.stale)
	assert.True(t, both.told.stale)
	assert.False(t, onlyB.told.stale, "a pull the session does not serve is left alone")
	assert.False(t, uncached.told.stale, "a host that caches nothing is told nothing")

	rig.book.purge(a) // again: each pull is queued once
	assert.Len(t, rig.book.stale, 2)
}

// A load whose keys have not all arrived by load_timeout_s fails: its
// fetches in flight are aborted, and the failure is reported exactly once,
// when the last of them ended, however many ticks pass.
func TestLoadPastItsDeadlineFailsOnce(t *testing.T) {
	rig := newBookRig(t)
	src, s := rig.source(1, "kv-a")
	s.hits["key1"], s.hits["key2"] = true, true
	rig.cachedRequest("r1", src)
	rows := []uint64{5, 6}
	require.True(t, rig.book.submitLoad("r1", 7, rig.now, [][]byte{[]byte("key1"), []byte("key2")}, rows))
	require.Len(t, s.fetches, 1, "keys the source reported are fetched at once")
	assert.Equal(t, 2, rig.book.guard.RowsOwed(s.id), "the source may write the load's rows")

	rig.now = rig.now.Add(rigLoadTimeout - time.Millisecond)
	rig.book.tickLoads(rig.now)
	assert.Empty(t, rig.reported, "not failed before its deadline")
	assert.Empty(t, s.aborted)

	rig.now = rig.now.Add(time.Millisecond)
	rig.book.tickLoads(rig.now)
	assert.Equal(t, []uint64{s.fetches[0].round}, s.aborted, "its fetch in flight is aborted")
	assert.Empty(t, rig.reported, "not reported while the source may still write its rows")
	rig.book.tickLoads(rig.now.Add(time.Second))
	assert.Len(t, s.aborted, 1, "aborted once")

	f := s.fetches[0]
	rig.book.loadDone(s, session.Report{Kind: session.LoadDone, JobID: f.jobID, KVID: f.kv, Round: f.round, Rows: f.rows})
	assert.Equal(t, []jobOutcome{{7, false}}, rig.reported)
	assert.Equal(t, 0, rig.book.guard.RowsOwed(s.id), "its rows are taken back")
	assert.Empty(t, rig.book.loads)
	assert.True(t, rig.book.request("r1").pull.failed, "the request recomputes")

	rig.book.tickLoads(rig.now.Add(time.Hour))
	rig.book.loadDone(s, session.Report{Kind: session.LoadDone, JobID: f.jobID, KVID: f.kv, Round: f.round, Rows: f.rows})
	assert.Len(t, rig.reported, 1, "reported exactly once")
}

// A load still waiting for its source's answers when its deadline passes
// has nothing in flight: it fails at that tick, once.
func TestProbingLoadPastItsDeadlineFailsAtOnce(t *testing.T) {
	rig := newBookRig(t)
	src, s := rig.source(1, "kv-a")
	s.hits["key1"] = true
	rig.cachedRequest("r1", src)
	s.unanswered = true // it reported key1, and answers the load's lookup late
	require.True(t, rig.book.submitLoad("r1", 9, rig.now, [][]byte{[]byte("key1")}, []uint64{3}))
	require.Empty(t, s.fetches, "nothing is fetched before the source answers")
	assert.Positive(t, s.flushed, "its lookup is sent now")

	rig.now = rig.now.Add(rigLoadTimeout)
	rig.book.tickLoads(rig.now)
	rig.book.tickLoads(rig.now.Add(time.Second))
	assert.Equal(t, []jobOutcome{{9, false}}, rig.reported)
	assert.Empty(t, s.aborted, "nothing was in flight")
	assert.Empty(t, rig.book.loads)
}

// The peer stopping reports nothing itself (the ledger fails every job),
// but no load is left for a late report, and a caching host learns that
// each of its requests fails.
func TestFailAllLeavesNoLoadAndTellsTheHost(t *testing.T) {
	rig := newBookRig(t)
	src, s := rig.source(1, "kv-a")
	s.hits["key1"] = true
	rig.cachedRequest("r1", src)
	require.True(t, rig.book.submitLoad("r1", 7, rig.now, [][]byte{[]byte("key1")}, []uint64{1}))
	rig.closed = true
	rig.book.failAll()
	assert.Empty(t, rig.book.loads)
	f := s.fetches[0]
	rig.book.loadDone(s, session.Report{Kind: session.LoadDone, JobID: 7, KVID: f.kv, Round: f.round, Rows: f.rows})
	assert.Empty(t, rig.reported, "a job the ledger failed is not reported again")
	changes := rig.book.takeAnswers(func(AnswerChange) bool { return true })
	assert.Equal(t, []AnswerChange{{ReqID: "r1", Failed: true}}, changes)
}

// finish is the only deleter of a request: its pull leaves the kv-id
// index with it, and its loads fail.
func TestFinishForgetsTheRequestAndItsPull(t *testing.T) {
	rig := newBookRig(t)
	src, s := rig.source(1, "kv-a")
	s.hits["key1"] = true
	rig.cachedRequest("r1", src)
	require.True(t, rig.book.submitLoad("r1", 7, rig.now, [][]byte{[]byte("key1")}, []uint64{1}))
	require.NotNil(t, rig.book.finish("r1"))
	assert.Nil(t, rig.book.request("r1"))
	assert.Empty(t, rig.book.pulls)
	assert.Len(t, s.aborted, 1, "its load in flight is aborted")
	assert.Nil(t, rig.book.finish("r1"), "finished once")
}

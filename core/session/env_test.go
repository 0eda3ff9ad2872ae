package session

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/data/memdata"
	"github.com/peerkv/peerkv/core/protocol"
)

const (
	testRowLen = 64
	testRows   = 16
	testKeyLen = 36
)

// fakeOwner plays core/tier for one session: it records what the session
// sends and reports, registers peers with a memdata transport at once, and
// owns a clock the test moves.
type fakeOwner struct {
	t        testing.TB
	env      *Env
	now      time.Time
	sent     []protocol.Message
	register []data.PeerInfo
	loads    map[int64]bool
	stores   map[int64]bool
	failed   []string
	answered []string // kv ids with probes answered (ProbesAnswered)
	ended    bool     // the session reported its end
	fetches  []string
	inbound  []*InboundLookup
	finished []*InboundLookup
	logs     []string
	nextID   int64
	session  *Session
	hub      *memdata.Hub
}

func newOwner(t testing.TB, localID string, mutate ...func(*config.Config)) *fakeOwner {
	cfg := config.Config{
		Host: "127.0.0.1", Port: 1, HashSeed: "42", KeyLen: testKeyLen,
		MaxPeers: 8, MaxRequestsPerPeer: 64, MaxKeysPerPeer: 1024,
	}.WithDefaults()
	for _, m := range mutate {
		m(&cfg)
	}
	o := &fakeOwner{t: t, now: time.Unix(1_790_000_000, 0), loads: map[int64]bool{}, stores: map[int64]bool{}}
	region := data.Region{Mem: make([]byte, testRows*testRowLen), RowLen: testRowLen}
	o.hub = memdata.NewHub()
	dt := o.hub.Transport(localID, region, nil)
	t.Cleanup(func() { _ = dt.Close() })
	o.env = &Env{
		LocalID: localID, Cfg: cfg, Region: region, Data: dt,
		Now:    func() time.Time { return o.now },
		Send:   func(_ string, m protocol.Message) error { o.sent = append(o.sent, roundTrip(t, m)); return nil },
		Report: o.apply,
		Logf: func(level, format string, args ...any) {
			o.logs = append(o.logs, level+" "+fmt.Sprintf(format, args...))
		},
		NextLookupID: func() int64 { o.nextID++; return o.nextID },
		Register: func(s *Session, info data.PeerInfo) {
			o.register = append(o.register, info)
			s.RegistrationDone(nil)
		},
	}
	return o
}

// reachData makes the session's data writes to peerID start (by default
// they fail to start: the peer is in no hub of ours). They succeed into
// the peer's first rows rows and fail beyond them.
func (o *fakeOwner) reachData(peerID string, rows int) {
	region := data.Region{Mem: make([]byte, rows*testRowLen), RowLen: testRowLen}
	peer := o.hub.Transport(peerID, region, nil)
	o.t.Cleanup(func() { _ = peer.Close() })
	require.NoError(o.t, o.env.Data.AddPeer(peerID, data.PeerInfo{NumRows: testRows, RowLen: testRowLen}))
}

// roundTrip encodes and decodes m as the wire would.
func roundTrip(t testing.TB, m protocol.Message) protocol.Message {
	b, err := protocol.Encode(m)
	require.NoError(t, err)
	out, err := protocol.Decode(b, protocol.Limits{KeyLen: testKeyLen})
	require.NoError(t, err)
	return out
}

// take returns and forgets what the session sent.
func (o *fakeOwner) take() []protocol.Message {
	out := o.sent
	o.sent = nil
	return out
}

// apply records a report at once: the fake owner has no state a session
// could see half-changed.
func (o *fakeOwner) apply(r Report) {
	switch r.Kind {
	case LoadDone:
		o.LoadDone(r.JobID, r.OK)
	case StoreDone:
		o.StoreDone(r.JobID, r.OK)
	case ConsumerFailed:
		o.failed = append(o.failed, r.KVID)
	case FetchArrived:
		o.fetches = append(o.fetches, r.KVID)
	case InboundReady:
		o.inbound = append(o.inbound, r.Lookup)
	case InboundFinished:
		o.finished = append(o.finished, r.Lookup)
	case ProbesAnswered:
		o.answered = append(o.answered, r.KVID)
	case Ended:
		require.False(o.t, o.ended, "session end reported twice")
		require.True(o.t, r.Session.Dead(), "end reported before the session is dead")
		o.ended = true
	default:
		o.t.Fatalf("unknown report %+v", r)
	}
}

func (o *fakeOwner) LoadDone(jobID int64, ok bool) {
	_, dup := o.loads[jobID]
	require.False(o.t, dup, "load %d reported twice", jobID)
	o.loads[jobID] = ok
}

func (o *fakeOwner) StoreDone(jobID int64, ok bool) {
	_, dup := o.stores[jobID]
	require.False(o.t, dup, "store %d reported twice", jobID)
	o.stores[jobID] = ok
}

// tick moves the clock and ticks the session, whose producer totals must
// still match a recount.
func (o *fakeOwner) tick(d time.Duration) {
	o.now = o.now.Add(d)
	o.session.Tick(o.now)
	checkHoldings(o.t, o.session)
}

// open starts the owner's session; the test's end checks its producer
// totals against a recount.
func (o *fakeOwner) open(peerID string, dialed bool) *Session {
	s := New(o.env, peerID, "127.0.0.1", dialed)
	o.session = s
	o.t.Cleanup(func() { checkHoldings(o.t, s) })
	return s
}

// pair is two sessions, A dialing B, whose messages the test delivers.
type pair struct {
	a, b   *fakeOwner
	sa, sb *Session
}

func newPair(t testing.TB, mutate ...func(*config.Config)) *pair {
	p := &pair{a: newOwner(t, "127.0.0.1:1001", mutate...), b: newOwner(t, "127.0.0.1:1002", mutate...)}
	p.sa = p.a.open("127.0.0.1:1002", true)
	p.sb = p.b.open("127.0.0.1:1001", false)
	return p
}

// pump delivers messages both ways until neither side sends more.
func (p *pair) pump() {
	for range 32 {
		fromA, fromB := p.a.take(), p.b.take()
		if len(fromA) == 0 && len(fromB) == 0 {
			return
		}
		for _, m := range fromA {
			p.sb.Handle(m)
		}
		for _, m := range fromB {
			p.sa.Handle(m)
		}
	}
	p.a.t.Fatal("the sessions kept talking")
}

func types(ms []protocol.Message) []protocol.Type {
	out := make([]protocol.Type, len(ms))
	for i, m := range ms {
		out[i] = m.MsgType()
	}
	return out
}

func key(i int) []byte {
	k := make([]byte, testKeyLen)
	k[0], k[1] = byte(i), byte(i>>8)
	return k
}

package tier

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/control"
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/data/memdata"
	"github.com/peerkv/peerkv/core/protocol"
	"github.com/peerkv/peerkv/core/session"
)

// Unit tests of peerSet on a fake clock, a fake control transport and real
// sessions whose frames the test delivers: no tier, no memctl, no waits.

const (
	testLocalID = "10.9.9.9:7000"
	testKeyLen  = 36
)

// fakeLinks is the control transport peerSet sees: it records connects and
// disconnects.
type fakeLinks struct {
	connects, disconnects []string
}

func (l *fakeLinks) Connect(peerID string) error { l.connects = append(l.connects, peerID); return nil }
func (l *fakeLinks) Disconnect(peerID string)    { l.disconnects = append(l.disconnects, peerID) }

// peerBench is a peerSet with the coordinator's part played by the test:
// settle applies the sessions' end reports and reaps, as the tier's does.
type peerBench struct {
	t       *testing.T
	now     time.Time
	links   fakeLinks
	set     *peerSet
	hub     *memdata.Hub
	reports []session.Report
	reaped  []*session.Session // what every reap returned, in order
	logs    []string
	// out holds what our sessions sent, by peer; in what the remote ends
	// sent us, by peer; remote the remote ends.
	out, in map[string][]protocol.Message
	remote  map[string]*session.Session
}

func newPeerBench(t *testing.T, mutate func(*config.Config)) *peerBench {
	cfg := config.Config{Host: "10.9.9.9", Port: 7000, HashSeed: "42", KeyLen: testKeyLen}.WithDefaults()
	if mutate != nil {
		mutate(&cfg)
	}
	b := &peerBench{
		t: t, now: time.Unix(1_790_000_000, 0), hub: memdata.NewHub(),
		out: map[string][]protocol.Message{}, in: map[string][]protocol.Message{}, remote: map[string]*session.Session{},
	}
	env := b.env(testLocalID, cfg, func(peerID string, m protocol.Message) {
		b.out[peerID] = append(b.out[peerID], roundTrip(t, m))
	})
	env.Report = func(r session.Report) { b.reports = append(b.reports, r) }
	adm, err := newAdmission(cfg)
	require.NoError(t, err)
	b.set = newPeerSet(peerDeps{
		cfg: cfg, env: env, now: b.clock, ctl: &b.links,
		logf:     b.logf,
		peerInfo: func(_ *session.Session, format string, args ...any) { b.logf("INFO", format, args...) },
		send:     env.Send,
		settle:   b.settle,
		onLoop:   func(f func()) { f() },
	}, adm, newRegistry(registryDeps{})) // the registry does not run: its ops stay queued for the test to read
	env.Busy = b.set.busy
	return b
}

func (b *peerBench) clock() time.Time { return b.now }

func (b *peerBench) logf(level, format string, args ...any) {
	b.logs = append(b.logs, level+" "+fmt.Sprintf(format, args...))
}

// env builds a session environment on the bench's clock and data hub.
func (b *peerBench) env(localID string, cfg config.Config, send func(string, protocol.Message)) *session.Env {
	region := data.Region{Mem: make([]byte, 16*64), RowLen: 64}
	dt := b.hub.Transport(localID, region, nil)
	b.t.Cleanup(func() { _ = dt.Close() })
	return &session.Env{
		LocalID: localID, Epoch: 1, Cfg: cfg, Region: region, Data: dt, Now: b.clock,
		Send:         func(peerID string, m protocol.Message) error { send(peerID, m); return nil },
		Report:       func(session.Report) {},
		Logf:         func(string, string, ...any) {},
		NextLookupID: func() int64 { return 0 },
		Register:     func(s *session.Session, _ data.PeerInfo) { s.RegistrationDone(nil) },
	}
}

func roundTrip(t testing.TB, m protocol.Message) protocol.Message {
	f, err := protocol.Encode(m)
	require.NoError(t, err)
	out, err := protocol.Decode(f, protocol.Limits{KeyLen: testKeyLen})
	require.NoError(t, err)
	return out
}

// settle is the coordinator's settle, for peerSet alone: end reports mark
// sessions ended, and the ended ones are reaped.
func (b *peerBench) settle() {
	for {
		for _, r := range b.reports {
			if r.Kind == session.Ended {
				b.set.endedSession(r.Session)
			}
		}
		b.reports = nil
		gone := b.set.reap()
		if len(gone) == 0 {
			return
		}
		b.reaped = append(b.reaped, gone...)
	}
}

// connect has peerID (from addr) dial us: admit decides, and an admitted
// peer's session handshakes to Ready. It returns admit's answer.
func (b *peerBench) connect(peerID, addr string) string {
	cfg := b.set.cfg
	cfg.Host, cfg.Port = "", 0
	remote := session.New(b.env(peerID, cfg, func(_ string, m protocol.Message) {
		b.in[peerID] = append(b.in[peerID], roundTrip(b.t, m))
	}), testLocalID, "", true)
	if why := b.set.admit(peerID, addr); why != "" {
		return why
	}
	b.remote[peerID] = remote
	b.set.open(peerID, addr, false)
	b.pump(peerID)
	return ""
}

// handshaking opens a session for a connect that never goes on.
func (b *peerBench) handshaking(peerID, addr string) string {
	if why := b.set.admit(peerID, addr); why != "" {
		return why
	}
	b.set.open(peerID, addr, false)
	return ""
}

// pump delivers frames both ways between our session with peerID and its
// remote end until neither sends more.
func (b *peerBench) pump(peerID string) {
	for range 32 {
		in, out := b.in[peerID], b.out[peerID]
		b.in[peerID], b.out[peerID] = nil, nil
		if len(in) == 0 && len(out) == 0 {
			return
		}
		for _, m := range in {
			if s := b.set.session(peerID); s != nil {
				s.Handle(m)
			}
		}
		for _, m := range out {
			b.remote[peerID].Handle(m)
		}
	}
	b.t.Fatal("the sessions kept talking")
}

// forgotten asserts that nothing peerSet holds names s.
func (b *peerBench) forgotten(s *session.Session) {
	b.t.Helper()
	assert.Nil(b.t, b.set.session(s.PeerID()), "session")
	assert.NotContains(b.t, b.set.active, s, "active")
	assert.NotContains(b.t, b.set.paths, s, "path")
	assert.NotContains(b.t, b.set.stats, s, "per-peer entry")
}

func ids(ss []*session.Session) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.PeerID()
	}
	return out
}

func TestPeerSetHandshakeToReady(t *testing.T) {
	b := newPeerBench(t, nil)
	require.Equal(t, "", b.connect("10.0.0.1:1", "10.0.0.1"))
	s := b.set.session("10.0.0.1:1")
	require.NotNil(t, s)
	assert.True(t, s.Ready(), "the bench's sessions finish their handshake")
	assert.NotNil(t, b.set.statsOf(s), "a per-peer entry is made with the session")
}

func TestPeerSetAdmitPerHostCap(t *testing.T) {
	b := newPeerBench(t, func(c *config.Config) { c.MaxPeersPerHost = 2 })
	require.Equal(t, "", b.connect("10.0.0.1:1", "10.0.0.1"))
	require.Equal(t, "", b.connect("10.0.0.1:2", "10.0.0.1"))
	assert.Contains(t, b.connect("10.0.0.1:3", "10.0.0.1"), "max_peers_per_host")
	assert.Equal(t, "", b.connect("10.0.1.1:1", "10.0.1.1"), "another address is not held to the first one's cap")
	assert.Equal(t, 3, b.set.count())
	assert.Equal(t, "it claims our own id", b.set.admit(testLocalID, "10.0.2.1"))
}

func TestPeerSetAdmitMaxPeersEvictsOnlyStalledHandshakes(t *testing.T) {
	b := newPeerBench(t, func(c *config.Config) { c.MaxPeers = 3; c.IdleTimeout = time.Hour })
	require.Equal(t, "", b.connect("10.0.0.1:1", "10.0.0.1"))
	require.Equal(t, "", b.connect("10.0.1.1:1", "10.0.1.1"))
	require.Equal(t, "", b.handshaking("10.0.2.1:1", "10.0.2.1"))
	stalled := b.set.session("10.0.2.1:1")

	assert.Contains(t, b.handshaking("10.0.3.1:1", "10.0.3.1"), "(max_peers)", "a handshake within its grace keeps its slot")
	assert.Empty(t, b.reaped)

	b.now = b.now.Add(handshakeGrace + time.Millisecond)
	assert.Equal(t, "", b.handshaking("10.0.3.1:1", "10.0.3.1"), "a stalled handshake gives its slot up")
	assert.Equal(t, []string{stalled.PeerID()}, ids(b.reaped), "only the stalled handshake ended")
	b.forgotten(stalled)
	assert.Equal(t, 3, b.set.count())
}

func TestPeerSetAdmitHandshakeShare(t *testing.T) {
	// 64 slots: at most max(8, 64/4) = 16 handshakes at once.
	b := newPeerBench(t, func(c *config.Config) { c.MaxPeers = 64 })
	for i := range 16 {
		b.now = b.now.Add(time.Millisecond) // the first is the oldest
		require.Equal(t, "", b.handshaking(fmt.Sprintf("10.0.%d.1:1", i), fmt.Sprintf("10.0.%d.1", i)))
	}
	assert.Contains(t, b.handshaking("10.1.0.1:1", "10.1.0.1"), "16 sessions are still handshaking (at most 16 at once)")
	assert.Equal(t, 16, b.set.count(), "the refused connect opened nothing")

	b.now = b.now.Add(2 * handshakeGrace)
	assert.Equal(t, "", b.handshaking("10.1.0.1:1", "10.1.0.1"), "the oldest stalled handshake yields")
	require.Len(t, b.reaped, 1)
	assert.Equal(t, "10.0.0.1:1", b.reaped[0].PeerID(), "the oldest one went")
	assert.Equal(t, 16, b.set.count())
}

func TestPeerSetIdleEvictionOnTheClock(t *testing.T) {
	// max_peers 4: the tick reaps idle sessions from the first one on
	// (within idleReapHeadroom of the cap).
	b := newPeerBench(t, func(c *config.Config) { c.MaxPeers = 4; c.IdleTimeout = 10 * time.Second })
	require.Equal(t, "", b.connect("10.0.0.1:1", "10.0.0.1"))
	require.Equal(t, "", b.connect("10.0.1.1:1", "10.0.1.1"))
	old1, old2 := b.set.session("10.0.0.1:1"), b.set.session("10.0.1.1:1")
	b.now = b.now.Add(5 * time.Second)
	require.Equal(t, "", b.connect("10.0.2.1:1", "10.0.2.1"))
	fresh := b.set.session("10.0.2.1:1")

	b.now = b.now.Add(4 * time.Second) // the old ones idle for 9 s: not the timeout yet
	b.set.reapIdle(b.now)
	assert.Empty(t, b.reaped, "no session is idle for over idle_timeout_s")

	b.now = b.now.Add(2 * time.Second)
	b.set.reapIdle(b.now)
	assert.ElementsMatch(t, []string{old1.PeerID(), old2.PeerID()}, ids(b.reaped), "exactly the idle ones end")
	b.forgotten(old1)
	b.forgotten(old2)
	assert.Same(t, fresh, b.set.session(fresh.PeerID()))
	assert.True(t, old1.Orderly(), "an idle session ends orderly")
	assert.ElementsMatch(t, []string{old1.PeerID(), old2.PeerID()}, b.links.disconnects, "their connections are let go")
	assert.Equal(t, int64(2), b.set.counts.closed)
}

func TestPeerSetReapReturnsExactlyTheEndedAndForgetsThem(t *testing.T) {
	b := newPeerBench(t, nil)
	for i := range 3 {
		require.Equal(t, "", b.connect(fmt.Sprintf("10.0.%d.1:1", i), fmt.Sprintf("10.0.%d.1", i)))
	}
	victim := b.set.session("10.0.1.1:1")
	b.set.setPath(victim, "tcp")
	b.set.busy(victim)

	victim.Close("peer connection lost", session.Dropped)
	b.settle()
	assert.Equal(t, []string{victim.PeerID()}, ids(b.reaped))
	b.forgotten(victim)
	assert.Equal(t, 2, b.set.count(), "the others stay")
	assert.Equal(t, []string{victim.PeerID()}, b.links.disconnects)
	assert.Equal(t, []registryOp{{peerID: victim.PeerID()}}, b.set.reg.ops, "its data-path peer is removed")

	// An end noted again (a stale report) reaps nothing twice.
	b.set.endedSession(victim)
	assert.Empty(t, b.set.reap())
	assert.Len(t, b.reaped, 1)

	// A replaced session is reaped, the new one under its id is not.
	old := b.set.session("10.0.0.1:1")
	b.set.open("10.0.0.1:1", "10.0.0.1", false)
	assert.Equal(t, []string{victim.PeerID(), old.PeerID()}, ids(b.reaped))
	assert.NotSame(t, old, b.set.session("10.0.0.1:1"))
	assert.NotNil(t, b.set.statsOf(b.set.session("10.0.0.1:1")))
	assert.Nil(t, b.set.statsOf(old))
}

func TestPeerSetDropAndCloseAllForgetEverySession(t *testing.T) {
	for _, close := range []bool{false, true} {
		b := newPeerBench(t, nil)
		require.Equal(t, "", b.connect("10.0.0.1:1", "10.0.0.1"))
		require.Equal(t, "", b.connect("10.0.1.1:1", "10.0.1.1"))
		all := []*session.Session{b.set.session("10.0.0.1:1"), b.set.session("10.0.1.1:1")}
		var gone []*session.Session
		if close {
			gone = b.set.closeAll("shutting down")
		} else {
			gone = b.set.drop()
		}
		assert.ElementsMatch(t, all, gone)
		for _, s := range all {
			b.forgotten(s)
			assert.Equal(t, close, s.Dead(), "closeAll closes, drop leaves the sessions as they are")
		}
		assert.Equal(t, 0, b.set.count())
	}
}

func TestPeerSetBackoffExpires(t *testing.T) {
	b := newPeerBench(t, nil)
	const nobody = "10.0.0.9:1"
	b.set.connectFailed(nobody, control.CauseRefused, false, "connection refused")
	_, err := b.set.dial(nobody)
	require.ErrorIs(t, err, errUnreachable)
	assert.Empty(t, b.links.connects, "no dial during the back-off")

	b.now = b.now.Add(FirstConnectBackoff)
	s, err := b.set.dial(nobody)
	require.NoError(t, err, "the back-off is over")
	assert.Equal(t, []string{nobody}, b.links.connects)

	// It fails again: the back-off doubles.
	s.Close("connection refused", session.Unreached(control.CauseRefused, false))
	b.settle()
	require.Equal(t, []string{nobody}, ids(b.reaped))
	b.now = b.now.Add(FirstConnectBackoff)
	_, err = b.set.dial(nobody)
	assert.ErrorIs(t, err, errUnreachable, "doubled: still backed off after the first back-off's length")
	b.now = b.now.Add(FirstConnectBackoff)
	assert.NoError(t, b.set.backedOff(nobody))

	// With no new failure the episode is forgotten once a dial would have
	// failed again by now.
	require.Contains(t, b.set.unreach.peers, nobody)
	b.set.expireEpisodes(b.now.Add(b.set.cfg.HandshakeTimeout))
	assert.Contains(t, b.set.unreach.peers, nobody, "not yet")
	b.set.expireEpisodes(b.now.Add(b.set.cfg.HandshakeTimeout + backoffMax + time.Second))
	assert.NotContains(t, b.set.unreach.peers, nobody)

	// A peer heard from ends its episode at once.
	b.set.connectFailed(nobody, control.CauseRefused, false, "connection refused")
	require.Error(t, b.set.backedOff(nobody))
	b.set.heardFrom(nobody)
	assert.NoError(t, b.set.backedOff(nobody))
}

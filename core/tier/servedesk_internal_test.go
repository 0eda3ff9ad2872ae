package tier

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/data/memdata"
	"github.com/peerkv/peerkv/core/protocol"
	"github.com/peerkv/peerkv/core/session"
)

const deskKeyLen = 36

// deskHarness is a serve desk with a fake clock and log, and a real
// ledger behind it, playing the tier for sessions it opens with peers the
// test simulates (no control or data transport: frames are handed over).
type deskHarness struct {
	t      *testing.T
	desk   *serveDesk
	jobs   *ledgerHarness
	cfg    config.Config
	hub    *memdata.Hub
	env    *session.Env                  // ours
	sent   map[string][]protocol.Message // by peer, not yet delivered
	remote map[string]*session.Session   // each peer's session with us
	wakes  int
}

func newDeskHarness(t *testing.T, mutate func(*config.Config)) *deskHarness {
	cfg := config.Config{
		Host: "127.0.0.1", Port: 1000, HashSeed: "42", KeyLen: deskKeyLen,
		MaxPeers: 8, MaxRequestsPerPeer: 64, MaxKeysPerPeer: 1024,
	}.WithDefaults()
	if mutate != nil {
		mutate(&cfg)
	}
	h := &deskHarness{t: t, jobs: newLedgerHarness(), cfg: cfg, hub: memdata.NewHub(),
		sent: map[string][]protocol.Message{}, remote: map[string]*session.Session{}}
	h.desk = newServeDesk(cfg, h.jobs.clock.now, h.jobs.log.logf, h.jobs.report, h.jobs.counts, func() { h.wakes++ })
	h.env = h.newEnv("127.0.0.1:1000", func(peerID string, m protocol.Message) {
		h.sent[peerID] = append(h.sent[peerID], m)
	}, func(r session.Report) {
		switch r.Kind { // as the tier's apply routes them
		case session.InboundReady:
			h.desk.inboundReady(r.Lookup)
		case session.InboundFinished:
			h.desk.inboundFinished(r.Lookup)
		case session.FetchArrived:
			h.desk.fetchArrived(r.Session, r.KVID)
		case session.StoreDone:
			h.jobs.report(r.JobID, r.OK, r.Bytes)
		}
	})
	h.env.NextLookupID = h.desk.nextLookupID
	return h
}

func (h *deskHarness) newEnv(localID string, send func(string, protocol.Message), report func(session.Report)) *session.Env {
	region := data.Region{Mem: make([]byte, 16*64), RowLen: 64}
	dt := h.hub.Transport(localID, region, nil)
	h.t.Cleanup(func() { _ = dt.Close() })
	return &session.Env{
		LocalID: localID, Cfg: h.cfg, Region: region, Data: dt, Now: h.jobs.clock.now,
		Send: func(peerID string, m protocol.Message) error {
			b, err := protocol.Encode(m) // as the wire has it
			require.NoError(h.t, err)
			out, err := protocol.Decode(b, protocol.Limits{KeyLen: deskKeyLen})
			require.NoError(h.t, err)
			send(peerID, out)
			return nil
		},
		Report:       report,
		Logf:         h.jobs.log.logf,
		NextLookupID: func() int64 { return 0 },
		Register:     func(s *session.Session, _ data.PeerInfo) { s.RegistrationDone(nil) },
	}
}

// peer opens a session with peerID, which dials us, and completes its
// handshake.
func (h *deskHarness) peer(peerID string) *session.Session {
	var toUs []protocol.Message
	env := h.newEnv(peerID, func(_ string, m protocol.Message) { toUs = append(toUs, m) }, func(session.Report) {})
	theirs := session.New(env, h.env.LocalID, "", true)
	ours := session.New(h.env, peerID, "127.0.0.1", false)
	h.remote[peerID] = theirs
	for range 32 {
		in, out := toUs, h.sent[peerID]
		toUs, h.sent[peerID] = nil, nil
		if len(in) == 0 && len(out) == 0 {
			require.True(h.t, ours.Ready(), "handshake with %s", peerID)
			return ours
		}
		for _, m := range in {
			ours.Handle(m)
		}
		for _, m := range out {
			theirs.Handle(m)
		}
	}
	h.t.Fatalf("the handshake with %s never settled", peerID)
	return nil
}

func deskKey(i int) []byte {
	k := make([]byte, deskKeyLen)
	k[0] = byte(i)
	return k
}

// A session's end removes exactly what the desk held for it: its inbound
// lookups, its fetch bindings and the frames waiting for its peer; another
// session's entries and claimed kv ids stay.
func TestPurgeRemovesExactlyThatSessionsEntries(t *testing.T) {
	h := newDeskHarness(t, nil)
	a, b := h.peer("127.0.0.1:2001"), h.peer("127.0.0.1:2002")

	a.Handle(&protocol.Lookup{KVRequestID: "kv-a", Keys: [][]byte{deskKey(1)}})
	b.Handle(&protocol.Lookup{KVRequestID: "kv-b", Keys: [][]byte{deskKey(2)}})
	require.Equal(t, 2, h.desk.inboundActive())
	require.Equal(t, 2, h.wakes, "the host is woken once per lookup queued")

	h.desk.fetchArrived(a, "pd-a") // unclaimed: the decoder asked first
	h.desk.claim("pd-claimed")     // a local prefill serves it
	h.desk.fetchArrived(a, "pd-claimed")
	h.desk.fetchArrived(b, "pd-b")
	require.Len(t, h.desk.serving, 3)

	for _, p := range []string{a.PeerID(), b.PeerID()} {
		require.True(t, h.desk.outbox.deferSend(p, &session.DeferredAnswer{}))
		require.True(t, h.desk.outbox.deferSend(p, &protocol.LookupResp{KVRequestID: "behind"}), "frames wait behind a deferred answer")
	}

	h.desk.purge(a)

	assert.Equal(t, 1, h.desk.inboundActive())
	for id, l := range h.desk.lookups {
		assert.Same(t, b, l.Session(), "lookup %d of another session was purged", id)
	}
	assert.NotContains(t, h.desk.serving, "pd-a", "an unclaimed binding goes with its session")
	require.Contains(t, h.desk.serving, "pd-claimed", "a claimed kv id stays for the prefill")
	assert.Equal(t, serveParked, h.desk.serving["pd-claimed"].state, "back to parking its stores")
	assert.Nil(t, h.desk.serving["pd-claimed"].s)
	require.Contains(t, h.desk.serving, "pd-b")
	assert.Same(t, b, h.desk.serving["pd-b"].s)
	assert.NotContains(t, h.desk.outbox.queues, a.PeerID())
	assert.Len(t, h.desk.outbox.queues[b.PeerID()], 2)
	assert.Equal(t, []string{b.PeerID()}, h.desk.outbox.peers)

	// The purged lookup's queued item is skipped; the other one is served.
	in, ok, taken := h.desk.next(nil)
	require.True(t, ok)
	require.True(t, taken)
	assert.Equal(t, InboundEvaluate, in.Kind)
	assert.Equal(t, [][]byte{deskKey(2)}, in.Keys)
	_, ok, _ = h.desk.next(nil)
	assert.False(t, ok, "nothing else is queued")
}

// Parked stores no decoder fetches fail at unbound_store_timeout_s, once;
// the kv id then refuses stores until its tombstone expires.
func TestParkedStoresExpireAtTheirDeadline(t *testing.T) {
	h := newDeskHarness(t, func(c *config.Config) {
		c.UnboundStoreTimeout = 2 * time.Second
		c.ReapedIDRetention = 5 * time.Second
	})
	clock := h.jobs.clock
	h.desk.claim("kv")
	for id := int64(1); id <= 2; id++ {
		h.jobs.mustAdmit(t, id, false)
		h.desk.store("kv", id, [][]byte{deskKey(int(id))}, []uint64{uint64(id)})
		clock.advance(time.Second) // a later batch keeps the first one's deadline
	}
	require.Equal(t, 2, h.desk.parkedStores())
	require.True(t, h.desk.pending())

	h.desk.tick(clock.now().Add(-time.Nanosecond))
	assert.Empty(t, h.jobs.take(10), "not before the deadline")

	h.desk.tick(clock.now())
	results := h.jobs.take(10)
	require.Len(t, results, 2)
	for _, r := range results {
		assert.False(t, r.Success)
	}
	assert.Equal(t, 0, h.desk.parkedStores())
	assert.False(t, h.desk.pending())
	assert.Equal(t, int64(2), h.jobs.counts.unboundExpired)
	assert.Len(t, h.jobs.log.matching("WARNING", "no decoder fetched kv_request_id=kv"), 1)

	h.desk.tick(clock.now()) // nothing is reported twice
	assert.Empty(t, h.jobs.take(10))
	assert.Empty(t, h.jobs.log.matching("ERROR"))

	h.jobs.mustAdmit(t, 3, false)
	h.desk.store("kv", 3, [][]byte{deskKey(3)}, []uint64{3})
	results = h.jobs.take(10)
	require.Len(t, results, 1, "a store for an expired kv id fails at once")
	assert.False(t, results[0].Success)

	clock.advance(5 * time.Second)
	h.desk.tick(clock.now())
	assert.Empty(t, h.desk.serving, "the tombstone is forgotten at reaped_id_retention_s")
}

// A fetch that came before any prefill waits unbound_store_timeout_s for
// one to start here; then the binding is dropped.
func TestAnUnclaimedFetchIsForgottenAtItsDeadline(t *testing.T) {
	h := newDeskHarness(t, func(c *config.Config) { c.UnboundStoreTimeout = 2 * time.Second })
	s := h.peer("127.0.0.1:2001")
	h.desk.fetchArrived(s, "kv")
	h.desk.tick(h.jobs.clock.now().Add(time.Second))
	require.Contains(t, h.desk.serving, "kv")
	h.desk.tick(h.jobs.clock.now().Add(2 * time.Second))
	assert.NotContains(t, h.desk.serving, "kv")
}

// The teardown forgets everything the desk holds; the ledger, not the
// desk, fails the parked stores' jobs, so each is reported once.
func TestTeardownClearsTheDeskAndFailsParkedStoresOnce(t *testing.T) {
	h := newDeskHarness(t, nil)
	a := h.peer("127.0.0.1:2001")
	a.Handle(&protocol.Lookup{KVRequestID: "kv-a", Keys: [][]byte{deskKey(1)}})
	h.jobs.mustAdmit(t, 1, false)
	h.desk.store("pd", 1, [][]byte{deskKey(1)}, []uint64{1})
	require.True(t, h.desk.outbox.deferSend(a.PeerID(), &session.DeferredAnswer{}))

	h.jobs.failAll()
	h.desk.clear()

	assert.Len(t, h.jobs.take(10), 1)
	assert.False(t, h.desk.pending())
	assert.Zero(t, h.desk.inboundActive())
	assert.Zero(t, h.desk.inboundQueued())
	assert.Empty(t, h.desk.serving)
	assert.Empty(t, h.desk.outbox.queues)
	assert.Empty(t, h.desk.outbox.peers)
	assert.Empty(t, h.jobs.log.matching("ERROR"))
}

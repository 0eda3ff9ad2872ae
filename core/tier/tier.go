package tier

import (
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"time"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/control"
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/params"
	"github.com/peerkv/peerkv/core/protocol"
	"github.com/peerkv/peerkv/core/session"
)

// Deps are the transports a Tier runs on.
type Deps struct {
	Control control.Transport
	// NewData builds the data transport; guard must be consulted for every
	// row a peer writes into our region; logf reaches the host's log.
	NewData func(guard data.WriteGuard, logf Logf) (data.Transport, error)
	// Now is the clock (nil = time.Now).
	Now func() time.Time
}

// request is one host request the tier knows.
type request struct {
	id     string
	source *params.Source
	dest   *params.Dest
}

// job is a submitted job not yet reported.
type job struct {
	isLoad bool
	at     time.Time
	rows   int
	peer   string // loads: the peer allowed to write its rows
}

// parked is a store batch of a prefill producer that no decoder fetched yet.
type parked struct {
	jobID int64
	keys  [][]byte
	rows  []uint64
	at    time.Time
}

// Tier is one peer. See the package comment for the threading model.
type Tier struct {
	cfg    config.Config
	region data.Region
	ctl    control.Transport
	dt     data.Transport
	now    func() time.Time
	env    *session.Env
	logs   *logRing

	mu       sync.Mutex
	closed   bool
	nonces   nonceCache // authenticated connects seen, against replays
	requests map[string]*request
	sessions map[string]*session.Session
	jobs     map[int64]*job
	finished []JobResult

	failedKV   map[string]struct{}         // consumer kv ids whose lookups answer MISS
	kvSession  map[string]*session.Session // producer kv id -> session that fetched it
	unbound    map[string][]parked         // producer kv id -> parked store batches
	reaped     map[string]time.Time        // producer kv ids whose parked stores expired
	finishedKV map[string]struct{}         // producer kv ids whose local request already finished
	inbound    inboundQueue                // work for the host's serve pass
	lookups    map[int64]*session.InboundLookup
	nextLookup int64
	stats      counters

	guardMu  sync.RWMutex
	expected map[uint64]string // consumer row -> peer allowed to write it

	registered chan registration
	stop       chan struct{}
	loopDone   chan struct{}
}

type registration struct {
	s   *session.Session
	err error
}

// New binds nothing itself: the control transport is already bound. It builds
// the data transport and starts the progress goroutine.
func New(cfg config.Config, region data.Region, deps Deps) (*Tier, error) {
	if region.RowLen == 0 || region.NumRows() == 0 || uint64(len(region.Mem)) != region.NumRows()*region.RowLen {
		return nil, fmt.Errorf("%w: region must hold a whole number (> 0) of rows of row_len > 0 bytes", ErrInvalidArgument)
	}
	if deps.Control == nil || deps.NewData == nil {
		return nil, fmt.Errorf("%w: control and data transports are required", ErrInvalidArgument)
	}
	now := deps.Now
	if now == nil {
		now = time.Now
	}
	t := &Tier{
		cfg:        cfg,
		region:     region,
		ctl:        deps.Control,
		now:        now,
		logs:       newLogRing(1 << 20),
		requests:   map[string]*request{},
		sessions:   map[string]*session.Session{},
		jobs:       map[int64]*job{},
		failedKV:   map[string]struct{}{},
		kvSession:  map[string]*session.Session{},
		unbound:    map[string][]parked{},
		reaped:     map[string]time.Time{},
		finishedKV: map[string]struct{}{},
		lookups:    map[int64]*session.InboundLookup{},
		expected:   map[uint64]string{},
		registered: make(chan registration, 64),
		stop:       make(chan struct{}),
		loopDone:   make(chan struct{}),
	}
	dt, err := deps.NewData(t.mayWrite, t.logf)
	if err != nil {
		return nil, err
	}
	t.dt = dt
	t.logf("INFO", "%s: data paths %s (TCP listener %q)", deps.Control.LocalID(), dt.Name(), dt.DataAddr())
	t.env = &session.Env{
		LocalID:      deps.Control.LocalID(),
		Cfg:          cfg,
		Region:       region,
		Data:         dt,
		Now:          now,
		Send:         t.send,
		Sink:         sink{t},
		Logf:         t.logf,
		Capabilities: t.capabilities,
		NextLookupID: func() int64 { t.nextLookup++; return t.nextLookup },
		Register:     t.register,
	}
	if cfg.AuthSecret != "" {
		t.env.Authenticate = t.authenticate
	}
	go t.loop()
	return t, nil
}

// LocalID is this peer's identity "host:port".
func (t *Tier) LocalID() string { return t.env.LocalID }

// mayWrite is the data path's write guard: a peer may write only rows of a
// load it is serving right now.
func (t *Tier) mayWrite(peerID string, row uint64) bool {
	t.guardMu.RLock()
	defer t.guardMu.RUnlock()
	return t.expected[row] == peerID
}

func (t *Tier) expect(peerID string, rows []uint64, on bool) {
	t.guardMu.Lock()
	defer t.guardMu.Unlock()
	for _, r := range rows {
		if on {
			t.expected[r] = peerID
		} else if t.expected[r] == peerID {
			delete(t.expected, r)
		}
	}
}

func (t *Tier) send(peerID string, m protocol.Message) error {
	frame, err := protocol.Encode(m)
	if err != nil {
		return err
	}
	t.stats.framesOut++
	return t.ctl.Send(peerID, frame)
}

// register adds the peer to the data path off the lock: NIXL metadata
// loading can take milliseconds.
func (t *Tier) register(s *session.Session, info data.PeerInfo) {
	go func() {
		defer t.recoverLoop("registration")
		err := t.dt.AddPeer(s.PeerID(), info)
		if err == nil {
			t.logPath(s.PeerID())
		}
		select {
		case t.registered <- registration{s, err}:
		case <-t.stop:
		}
	}()
}

// logPath says which data path serves peerID and, when faster paths the
// peer offered could not, why.
func (t *Tier) logPath(peerID string) {
	m, ok := t.dt.(interface {
		PathTo(string) string
		Refused(string) string
	})
	if !ok {
		t.logf("INFO", "peer %s: data path %s", peerID, t.dt.Name())
		return
	}
	if why := m.Refused(peerID); why != "" {
		t.logf("WARNING", "peer %s: data path %s; not faster ones: %s", peerID, m.PathTo(peerID), why)
		return
	}
	t.logf("INFO", "peer %s: data path %s", peerID, m.PathTo(peerID))
}

// loop is the progress goroutine: inbound frames, transfer completions,
// registrations and deadlines.
func (t *Tier) loop() {
	defer close(t.loopDone)
	defer t.recoverLoop("progress loop")
	tick := time.NewTicker(t.cfg.Tick)
	defer tick.Stop()
	events := t.ctl.Events()
	completions := t.dt.Completions()
	for {
		select {
		case <-t.stop:
			return
		case ev, ok := <-events:
			if !ok {
				events = nil
				continue
			}
			t.locked(func() { t.onEvent(ev) })
		case c, ok := <-completions:
			if !ok {
				completions = nil
				continue
			}
			t.locked(func() {
				if s := t.sessions[c.PeerID]; s != nil {
					s.TransferComplete(c.ID, c.Err)
				}
			})
		case r := <-t.registered:
			t.locked(func() { r.s.RegistrationDone(r.err) })
		case <-tick.C:
			t.locked(t.onTick)
		}
	}
}

func (t *Tier) locked(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	f()
	t.reapDead()
}

func (t *Tier) recoverLoop(where string) {
	if r := recover(); r != nil {
		t.logf("ERROR", "internal error in %s: %v\n%s", where, r, debug.Stack())
	}
}

func (t *Tier) onEvent(ev control.Event) {
	switch ev.Kind {
	case control.EventPeerDown:
		if s := t.sessions[ev.PeerID]; s != nil {
			s.Kill(fmt.Sprintf("connection lost: %v", ev.Err))
		}
	case control.EventFrame:
		t.stats.framesIn++
		m, err := protocol.Decode(ev.Frame, protocol.Limits{
			MaxFrameBytes: t.cfg.MaxFrameBytes, MaxListItems: t.cfg.MaxListItems, KeyLen: t.cfg.KeyLen,
		})
		s := t.sessions[ev.PeerID]
		if s == nil {
			if err != nil || m.MsgType() != protocol.TypeConnect {
				t.stats.droppedFrames++
				t.logf("WARNING", "dropping a frame from %s, which has no session (first message must be connect): %v", ev.PeerID, describe(m, err))
				return
			}
			if len(t.sessions) >= t.cfg.MaxPeers {
				t.logf("WARNING", "refusing peer %s: %d sessions already (max_peers)", ev.PeerID, len(t.sessions))
				_ = t.send(ev.PeerID, &protocol.Disconnect{})
				return
			}
			s = t.openSession(ev.PeerID)
		}
		if err != nil {
			t.stats.badFrames++
			s.HandleDecodeError(err)
			return
		}
		s.Handle(m)
	}
}

func describe(m protocol.Message, err error) string {
	if err != nil {
		return err.Error()
	}
	return string(m.MsgType())
}

func (t *Tier) openSession(peerID string) *session.Session {
	s := session.New(t.env, peerID)
	t.sessions[peerID] = s
	t.stats.sessionsOpened++
	t.logf("INFO", "session with %s opened", peerID)
	return s
}

// sessionFor returns the live session to peerID, opening one if allowed.
func (t *Tier) sessionFor(peerID string) (*session.Session, error) {
	if s := t.sessions[peerID]; s != nil && !s.Dead() {
		return s, nil
	}
	if peerID == t.env.LocalID {
		return nil, errors.New("a peer cannot pull from itself")
	}
	if len(t.sessions) >= t.cfg.MaxPeers {
		return nil, fmt.Errorf("session limit reached (%d, option max_peers)", t.cfg.MaxPeers)
	}
	if err := t.ctl.Connect(peerID); err != nil {
		return nil, err
	}
	return t.openSession(peerID), nil
}

func (t *Tier) onTick() {
	now := t.now()
	for _, s := range t.sessions {
		s.Tick(now)
	}
	t.reapUnbound(now)
}

// reapDead closes sessions that ended and forgets them.
func (t *Tier) reapDead() {
	for id, s := range t.sessions {
		if !s.Dead() {
			continue
		}
		t.logf("WARNING", "peer %s down: %s", id, s.DeathReason())
		s.Close(s.DeathReason())
		delete(t.sessions, id)
		for kv, bound := range t.kvSession {
			if bound == s {
				delete(t.kvSession, kv)
			}
		}
		t.dropInbound(s)
		t.dt.RemovePeer(id)
		t.ctl.Disconnect(id)
		t.stats.sessionsClosed++
	}
}

// reapUnbound fails parked stores no decoder fetched in time.
func (t *Tier) reapUnbound(now time.Time) {
	for kv, at := range t.reaped {
		if now.Sub(at) >= t.cfg.ReapedIDRetention {
			delete(t.reaped, kv)
		}
	}
	for kv, batches := range t.unbound {
		if len(batches) == 0 || now.Sub(batches[0].at) < t.cfg.UnboundStoreTimeout {
			continue
		}
		delete(t.unbound, kv)
		delete(t.finishedKV, kv)
		t.reaped[kv] = now
		for _, b := range batches {
			t.report(b.jobID, false, 0)
		}
		t.stats.unboundExpired += int64(len(batches))
		t.logf("WARNING", "no decoder fetched kv_request_id=%s within %v; released %d stored batch(es) (raise unbound_store_timeout_s if prefills outlast it)",
			kv, t.cfg.UnboundStoreTimeout, len(batches))
	}
}

// report delivers a job's single outcome to the host.
func (t *Tier) report(jobID int64, ok bool, bytes int64) {
	j := t.jobs[jobID]
	if j == nil {
		t.logf("ERROR", "internal: job %d reported twice or never submitted (ignored)", jobID)
		return
	}
	delete(t.jobs, jobID)
	if j.isLoad {
		if ok {
			t.stats.loadsOK++
			t.stats.bytesIn += bytes
		} else {
			t.stats.loadsFailed++
		}
	} else {
		if ok {
			t.stats.storesOK++
			t.stats.bytesOut += bytes
		} else {
			t.stats.storesFailed++
		}
	}
	t.finished = append(t.finished, JobResult{
		JobID: jobID, Success: ok, IsLoad: j.isLoad, Bytes: bytes, Duration: t.now().Sub(j.at),
	})
}

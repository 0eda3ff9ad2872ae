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
	"github.com/peerkv/peerkv/core/data/rowsum"
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
	// NotAllowedAtAccept, when set, counts the control connections the
	// transport shut as it accepted them, their address outside
	// allowed_peers: refusals whose connect never reached the tier, added
	// to the not_allowed rejections.
	NotAllowedAtAccept func() uint64
}

// request is one host request the tier knows.
type request struct {
	id   string
	pull *pull // its sources (remote_prefiller, remote_kv_source), nil if none
	dest *params.Dest
}

// job is a submitted job not yet reported.
type job struct {
	isLoad bool
	at     time.Time
	load   *pullLoad // loads from a source: its parts and deadline
}

// idleReapHeadroom: idle sessions are evicted only once this close to
// max_peers, so a quiet mesh is not torn down (vLLM's _IDLE_REAP_HEADROOM).
const idleReapHeadroom = 8

// Tier is one peer. See the package comment for the threading model.
type Tier struct {
	cfg    config.Config
	region data.Region
	ctl    control.Transport
	dt     data.Transport
	rows   *rowsum.Writer // starts dt's writes, summing those of verified pulls
	// checked carries verified loads' checks back to the loop (verify.go);
	// checking counts the checks reading the region, which Shutdown waits
	// for (the host may free the region once it returns).
	checked  chan checked
	checking sync.WaitGroup
	// beforeCheck, if set (tests), runs before a verified load's rows are
	// checked, on the checking goroutine.
	beforeCheck func(rows []uint64)
	now         func() time.Time
	env         *session.Env
	logs        *logRing
	// limiter rate-limits log lines per cause (logs.go); it has its own
	// lock, as data paths log from their goroutines.
	limiter logLimiter
	reg     *registry
	notify  notifier // the host's notification fd; see notify.go
	news    news     // what the host has to collect, read without a call; see news.go

	mu       sync.Mutex
	closed   bool
	poisoned error // set once a goroutine of ours panicked
	requests map[string]*request
	sessions map[string]*session.Session
	// active holds the sessions not Quiet: only they are ticked, flushed
	// and asked for pending work, so a step costs O(sessions in use), not
	// O(peers). A session joins when opened and when it takes on a request
	// (Env.Busy), and leaves when a tick finds it quiet or it is reaped.
	active        map[*session.Session]struct{}
	jobs          map[int64]*job
	finished      []JobResult
	serving       map[string]*serveKV // PD kv ids this peer serves as a prefiller
	parkedBatches int                 // store batches parked in serving, summed
	inbound       inboundQueue        // work for the host's serve pass
	lookups       map[int64]*session.InboundLookup
	pulls         pullIndex // live pulls by kv id (answers.go)
	stale         []*pull   // pulls to re-evaluate at the end of settle
	answered      []*pull   // pulls with changes for TakeAnswers
	toRegister    []*pull   // pulls with a first ask to register (asked.go)
	registerWake  chan struct{}
	nextLookup    int64
	pending       []session.Report   // sessions' reports not yet applied (see settle)
	ended         []*session.Session // sessions that reported their end, for reapDead
	stats         counters
	obs           observations // by cause, by path, histograms (observe.go)
	refused       refusals     // stock peers we dialed and refused lately (refusals.go)
	adm           admission    // allowed_peers and fair admission (admission.go)

	// Peers we could not connect to lately (unreachable.go), and what
	// goroutines found of peers off the lock, for the loop to apply.
	unreach        unreachable
	found          chan func()
	spellingChecks int // name resolutions running (spelling.go)

	guardMu  sync.RWMutex
	expected map[uint64]string // consumer row -> peer allowed to write it
	owed     map[string]int    // peer -> how many rows of expected it may write

	outbox       outbox // frames waiting behind a deferred answer (outbox.go)
	lanes        lanes  // sessions' large frames waiting to be decoded (lanes.go)
	registered   chan registration
	stop         chan struct{}
	loopDone     chan struct{}
	shutdownOnce sync.Once
	shutdownErr  error
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
	adm, err := newAdmission(cfg)
	adm.atAccept = deps.NotAllowedAtAccept
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidArgument, err)
	}
	t := &Tier{
		cfg:          cfg,
		region:       region,
		ctl:          deps.Control,
		now:          now,
		logs:         newLogRing(1 << 20),
		news:         newNews(),
		requests:     map[string]*request{},
		sessions:     map[string]*session.Session{},
		active:       map[*session.Session]struct{}{},
		jobs:         map[int64]*job{},
		serving:      map[string]*serveKV{},
		lookups:      map[int64]*session.InboundLookup{},
		pulls:        pullIndex{},
		expected:     map[uint64]string{},
		owed:         map[string]int{},
		registered:   make(chan registration, 64),
		checked:      make(chan checked, 64),
		registerWake: make(chan struct{}, 1),
		found:        make(chan func(), maxDiagnoses),
		obs:          newObservations(),
		adm:          adm,
		outbox:       newOutbox(),
		lanes:        newLanes(),
		stop:         make(chan struct{}),
		loopDone:     make(chan struct{}),
	}
	dt, err := deps.NewData(rowGuard{t}, t.logf)
	if err != nil {
		return nil, err
	}
	t.dt = dt
	t.rows = rowsum.NewWriter(dt, region)
	t.logf("INFO", "data paths %s (TCP listener %q)", dt.Name(), dt.DataAddr())
	t.env = &session.Env{
		LocalID:        deps.Control.LocalID(),
		Epoch:          newEpoch(),
		Cfg:            cfg,
		Region:         region,
		Data:           dt,
		Rows:           t.rows,
		Now:            now,
		Send:           t.sessionSend,
		Report:         func(r session.Report) { t.pending = append(t.pending, r) },
		Logf:           t.logLimited, // a peer, even a stranger, can make a session log: every level rate-limited
		NextLookupID:   func() int64 { t.nextLookup++; return t.nextLookup },
		LookupAnswered: t.lookupAnswered,
		LookupServed:   func(held time.Duration) { t.obs.lookupServed.observe(held.Seconds()) },
		Register:       func(s *session.Session, info data.PeerInfo) { t.reg.add(s, info) },
		Busy:           func(s *session.Session) { t.active[s] = struct{}{} },
		Keys:           &session.KeyBudget{},
	}
	t.reg = newRegistry(t)
	go t.reg.run()
	if h, ok := deps.Control.(control.Handing); ok {
		h.Hand(t.handle) // frames are taken on the transport's goroutine; Events then only closes
	}
	go t.loop()
	go t.runOutbox()
	go t.runLanes()
	return t, nil
}

// LocalID is this peer's identity "host:port".
func (t *Tier) LocalID() string { return t.env.LocalID }

// rowGuard is the data path's write guard: a peer may write only rows of a
// load it is serving right now. Copies hold the read lock, and releasing a
// load's rows (expect off) takes the write lock, so no row lands after the
// load ended.
type rowGuard struct{ t *Tier }

func (g rowGuard) MayWrite(peerID string, row uint64) bool {
	g.t.guardMu.RLock()
	defer g.t.guardMu.RUnlock()
	return g.t.expected[row] == peerID
}

// RowsOwed implements data.OwedRows: the data path refuses a transfer
// naming more rows before it allocates anything for them.
func (g rowGuard) RowsOwed(peerID string) int {
	g.t.guardMu.RLock()
	defer g.t.guardMu.RUnlock()
	return g.t.owed[peerID]
}

func (g rowGuard) WriteRow(peerID string, row uint64, dst, src []byte) bool {
	g.t.guardMu.RLock()
	defer g.t.guardMu.RUnlock()
	if g.t.expected[row] != peerID {
		return false
	}
	copy(dst, src)
	return true
}

func (t *Tier) expect(peerID string, rows []uint64, on bool) {
	t.guardMu.Lock()
	defer t.guardMu.Unlock()
	for _, r := range rows {
		prev, had := t.expected[r]
		switch {
		case on && !(had && prev == peerID):
			if had {
				t.unowe(prev)
			}
			t.expected[r] = peerID
			t.owed[peerID]++
		case !on && had && prev == peerID:
			delete(t.expected, r)
			t.unowe(peerID)
		}
	}
}

// unowe takes one row off what peerID may write; guardMu held.
func (t *Tier) unowe(peerID string) {
	if t.owed[peerID]--; t.owed[peerID] <= 0 {
		delete(t.owed, peerID)
	}
}

func (t *Tier) send(peerID string, m protocol.Message) error {
	if t.deferSend(peerID, m) {
		return nil
	}
	frame, err := protocol.Encode(m)
	if err != nil {
		return err
	}
	t.stats.framesOut++
	return t.ctl.Send(peerID, frame)
}

// sessionSend is a session's Send. The goodbye of a refused handshake with
// a stock peer that dialed us is paced, as refuseBeforeSession's are
// (refusals.go): one that finds the peer without a session draws a connect.
func (t *Tier) sessionSend(peerID string, m protocol.Message) error {
	if _, bye := m.(*protocol.Disconnect); bye {
		t.dropOutbox(peerID) // the session ends: what waited for it is moot
		s := t.sessions[peerID]
		if s != nil && !s.Dialed() && !s.Ready() && !t.closed { // at shutdown nothing can loop
			if seen, ok := s.Seen(); ok && !seen.PeerKV && !t.refused.goodbyeNow(peerID, t.now()) {
				return nil // owed: sent at the end of the pace
			}
		}
	}
	t.observeSent(peerID, m)
	return t.send(peerID, m)
}

// logPath says which data path serves s's peer and, when faster paths the
// peer offered could not, why.
func (t *Tier) logPath(s *session.Session) {
	peerID := s.PeerID()
	m, ok := t.dt.(interface {
		PathTo(string) string
		Refused(string) string
	})
	if !ok {
		t.peerInfo(s, "peer %s: data path %s", peerID, t.dt.Name())
		return
	}
	if why := m.Refused(peerID); why != "" {
		t.logf("WARNING", "peer %s: data path %s; not faster ones: %s", peerID, m.PathTo(peerID), why)
		return
	}
	t.peerInfo(s, "peer %s: data path %s", peerID, m.PathTo(peerID))
}

// loop is the progress goroutine: inbound frames, transfer completions,
// registrations and deadlines.
func (t *Tier) loop() {
	defer close(t.loopDone)
	defer t.recoverLoop("the progress loop")
	tick := time.NewTicker(t.cfg.Tick)
	defer tick.Stop()
	events := t.ctl.Events()
	completions := t.rows.Completions()
	for {
		select {
		case <-t.stop:
			return
		case ev, ok := <-events:
			if !ok {
				// Shutdown stops this loop before closing the transport, so this
				// is the control path dying under us: nothing more can arrive.
				t.poison(fmt.Errorf("%w: the control transport stopped; the peer is stopped", ErrInternal))
				return
			}
			t.take(ev)
		case c, ok := <-completions:
			if !ok {
				completions = nil
				continue
			}
			t.locked(func() {
				if s := t.sessions[c.PeerID]; s != nil {
					s.Complete(c)
				}
			})
		case c := <-t.checked:
			t.locked(func() { t.verdict(c) })
		case r := <-t.registered:
			t.locked(func() {
				if r.err == nil {
					t.observeRegistered(r.s)
				}
				r.s.RegistrationDone(r.err)
				t.observeReady(r.s)
			})
		case f := <-t.found:
			t.locked(f)
		case <-t.registerWake:
			more := false
			t.locked(func() { more = t.registerSomeAsked() })
			if more {
				t.wakeRegister() // after the events that came meanwhile
			}
		case <-tick.C:
			t.locked(t.onTick)
		}
	}
}

// locked runs f under the lock, then settles what f set off.
func (t *Tier) locked(f func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return
	}
	testPanic("loop")
	f()
	t.settle()
}

// handle takes one control event on the transport's own goroutine
// (control.Handing), sparing each frame a hand-off to the loop.
func (t *Tier) handle(ev control.Event) {
	defer t.recoverLoop("the control path's handler")
	t.take(ev)
}

// onFrame handles a frame screen let through, decoded off the lock: the
// sessions may have changed meanwhile, so everything is checked again.
func (t *Tier) onFrame(ev control.Event, m protocol.Message, err error) {
	s := t.sessions[ev.PeerID]
	if s == nil {
		if err != nil || m.MsgType() != protocol.TypeConnect {
			t.dropSessionless(ev.PeerID, describe(m, err))
			return
		}
		// A stock peer's connect may be the one our goodbye drew (refusals.go).
		stock := m.(*protocol.Connect).PeerKV == nil
		quiet := stock && t.refused.take(ev.PeerID, t.now())
		if why := t.admit(ev.PeerID, ev.Addr); why != "" {
			t.refuseBeforeSession(ev.PeerID, ev.Addr, why, stock, quiet)
			return
		}
		s = t.openSession(ev.PeerID, ev.Addr, false)
		t.noteSpelling(ev.PeerID, ev.Addr)
		t.refused.owes(ev.PeerID) // a goodbye still owed would end this session
		if quiet {
			s.RefuseQuietly()
		}
	}
	if !t.fromSource(s, ev) {
		return
	}
	if err == nil && t.replaceRestarted(s, m) {
		// As for any new session a connect opens (above).
		quiet := m.(*protocol.Connect).PeerKV == nil && t.refused.take(ev.PeerID, t.now())
		s = t.openSession(ev.PeerID, ev.Addr, false)
		t.refused.owes(ev.PeerID)
		if quiet {
			s.RefuseQuietly()
		}
	}
	t.observeFrame(s, m, err)
	if err != nil {
		t.stats.badFrames++
		s.HandleDecodeError(err)
		return
	}
	if m.MsgType() == protocol.TypeConnect {
		t.heardFrom(ev.PeerID) // reachable: any back-off is over
	}
	s.Handle(m)
	t.observeReady(s)
}

// refuseBeforeSession refuses a connect admit turned away. A peerkv peer
// gets its goodbye at once; a stock peer's goodbyes are paced, and none
// answers the connect our own goodbye drew (refusals.go).
func (t *Tier) refuseBeforeSession(peerID, addr, why string, stock, quiet bool) {
	t.stats.sessionsRefused++
	switch {
	case peerID == t.env.LocalID:
		t.obs.rejections[session.CauseIdentity]++
	case why == whyNotAllowed:
		t.obs.rejections[CauseNotAllowed]++
	default:
		t.obs.rejections[CauseLimit]++
	}
	if why == whyNotAllowed {
		t.logRefused(&t.adm.connects, "refusing peer %s (from %s): %s", peerID, addr, why)
	} else {
		t.logf("WARNING", "refusing peer %s (from %s): %s", peerID, addr, why)
	}
	if peerID == t.env.LocalID || quiet {
		return
	}
	if !stock || t.refused.goodbyeNow(peerID, t.now()) {
		t.sayGoodbye(peerID)
	}
}

// sayGoodbye tells a peer that holds no session here that it was refused.
func (t *Tier) sayGoodbye(peerID string) {
	_ = t.send(peerID, &protocol.Disconnect{})
	t.ctl.Disconnect(peerID) // the goodbye lingers briefly, then the connection closes
}

func describe(m protocol.Message, err error) string {
	if err != nil {
		return err.Error()
	}
	return string(m.MsgType())
}

// admit decides whether a connect from an unknown identity may open a
// session. addr is where the connection really comes from (the id is a
// claim), so one source cannot take every slot.
func (t *Tier) admit(peerID, addr string) string {
	if peerID == t.env.LocalID {
		return "it claims our own id"
	}
	if !t.adm.allow.AllowsAddr(addr) {
		return whyNotAllowed
	}
	// An unknown address ("") is one source too.
	fromAddr, handshaking := 0, 0
	for _, s := range t.sessions {
		if s.Source() == addr {
			fromAddr++
		}
		if !s.Ready() && !s.Dialed() {
			handshaking++
		}
	}
	if fromAddr >= t.cfg.MaxPeersPerHost {
		return fmt.Sprintf("%d sessions from %q already (max_peers_per_host)", fromAddr, addr)
	}
	// Connects that never finish cannot take more than a share of the
	// slots: beyond it the oldest stalled one yields, or the newcomer waits.
	if limit := max(8, t.cfg.MaxPeers/4); handshaking >= limit {
		t.evictStalledHandshake(t.now(), fmt.Sprintf("%d handshakes are running (at most %d at once)", handshaking, limit))
		if n := t.countHandshaking(); n >= limit {
			return fmt.Sprintf("%d sessions are still handshaking (at most %d at once)", n, limit)
		}
	}
	if len(t.sessions) >= t.cfg.MaxPeers {
		t.evictIdle(t.now(), true)
	}
	if len(t.sessions) >= t.cfg.MaxPeers {
		t.evictStalledHandshake(t.now(), "every session slot is taken (max_peers)")
	}
	if len(t.sessions) >= t.cfg.MaxPeers {
		t.makeRoom(addr, false)
	}
	if len(t.sessions) >= t.cfg.MaxPeers {
		return fmt.Sprintf("%d sessions already (max_peers)", len(t.sessions))
	}
	return ""
}

// handshakeGrace is how long a handshake may take before its slot can go to
// a newcomer when every slot is taken: real peers finish in milliseconds,
// so only connects that never complete (a flood) lose their slot.
const handshakeGrace = time.Second

func (t *Tier) countHandshaking() int {
	n := 0
	for _, s := range t.sessions {
		if !s.Ready() && !s.Dialed() {
			n++
		}
	}
	return n
}

// evictStalledHandshake frees the slot of the oldest session whose
// handshake has not finished after handshakeGrace.
func (t *Tier) evictStalledHandshake(now time.Time, why string) {
	var oldest *session.Session
	for _, s := range t.sessions {
		// Sessions we dialed carry our own loads: never ours to give up.
		if s.Dead() || s.Ready() || s.Dialed() || now.Sub(s.OpenedAt()) < handshakeGrace {
			continue
		}
		if oldest == nil || s.OpenedAt().Before(oldest.OpenedAt()) {
			oldest = s
		}
	}
	if oldest != nil {
		oldest.Close(fmt.Sprintf("handshake unfinished after %v while %s", now.Sub(oldest.OpenedAt()).Round(time.Millisecond), why))
		t.settle()
	}
}

// openSession starts a session; source is the kernel-reported address of a
// peer that dialed us ("" for one we dial).
func (t *Tier) openSession(peerID, source string, dialed bool) *session.Session {
	return t.open(peerID, func() *session.Session { return session.New(t.env, peerID, source, dialed) })
}

func (t *Tier) open(peerID string, newSession func() *session.Session) *session.Session {
	if old := t.sessions[peerID]; old != nil {
		// Never drop a session unclosed: its jobs would go unreported.
		old.CloseOrderly("replaced by a new session")
		t.settle()
	}
	s := newSession()
	t.sessions[peerID] = s
	t.obs.peerOpened(s)
	t.active[s] = struct{}{} // its handshake has a deadline
	t.stats.sessionsOpened++
	t.logf("DEBUG", "session with %s opened", peerID) // its "data path" line (INFO) says it is up
	return s
}

// sessionFor returns the live session to peerID, opening one if allowed.
func (t *Tier) sessionFor(peerID string) (*session.Session, error) {
	return t.dial(peerID, false)
}

// dial is sessionFor; probing opens a handshake-only probe (Probe).
func (t *Tier) dial(peerID string, probing bool) (*session.Session, error) {
	if err := t.mayDial(peerID); err != nil {
		return nil, err // before an open session too: it may be a peer that dialed us claiming that name
	}
	if s := t.sessions[peerID]; s != nil {
		if !s.Dead() {
			return s, nil
		}
		t.settle() // close it (its jobs reported) before a new one takes its place
	}
	if peerID == t.env.LocalID {
		return nil, errors.New("a peer cannot pull from itself")
	}
	if err := t.backedOff(peerID); err != nil {
		return nil, err // before any session gives its slot up for the dial
	}
	if len(t.sessions) >= t.cfg.MaxPeers {
		t.evictIdle(t.now(), true)
	}
	if len(t.sessions) >= t.cfg.MaxPeers {
		t.makeRoom("", true)
	}
	if len(t.sessions) >= t.cfg.MaxPeers {
		return nil, fmt.Errorf("session limit reached (%d, option max_peers)", t.cfg.MaxPeers)
	}
	if err := t.ctl.Connect(peerID); err != nil {
		return nil, err
	}
	if t.refused.owes(peerID) {
		// A stock peer we refused inside the pace still waits for its
		// goodbye, which our session would otherwise cancel: it goes first.
		_ = t.send(peerID, &protocol.Disconnect{})
	}
	if probing {
		return t.open(peerID, func() *session.Session { return session.NewProbe(t.env, peerID) }), nil
	}
	return t.openSession(peerID, "", true), nil
}

func (t *Tier) onTick() {
	now := t.now()
	for s := range t.active {
		s.Tick(now)
		if s.Quiet() {
			delete(t.active, s)
		}
	}
	t.tickServing(now)
	t.tickLoads(now)
	t.expireEpisodes(now)
	t.flushLogs(now)
	for _, id := range t.refused.dueGoodbyes(now) {
		if s := t.sessions[id]; s == nil || s.Dead() { // a session opened since would end with it
			t.sayGoodbye(id)
		}
	}
	if len(t.sessions) >= t.cfg.MaxPeers-min(idleReapHeadroom, t.cfg.MaxPeers-1) {
		t.evictIdle(now, false)
	}
}

// evictIdle ends sessions with no work and no traffic for idle_timeout_s
// (all of them, or only the longest idle one when a slot is needed now).
func (t *Tier) evictIdle(now time.Time, one bool) {
	if t.cfg.IdleTimeout <= 0 {
		return
	}
	var oldest *session.Session
	for _, s := range t.sessions {
		if s.Dead() || s.HasPendingWork() || now.Sub(s.LastActivity()) < t.cfg.IdleTimeout {
			continue
		}
		if !one {
			s.CloseOrderly(fmt.Sprintf("idle for over %v", t.cfg.IdleTimeout))
			continue
		}
		if oldest == nil || s.LastActivity().Before(oldest.LastActivity()) {
			oldest = s
		}
	}
	if oldest != nil {
		oldest.CloseOrderly(fmt.Sprintf("idle for over %v; its slot is needed", t.cfg.IdleTimeout))
	}
	t.settle()
}

// reapDead closes sessions that ended and forgets them, reporting whether
// there were any; only settle calls it, and applies what Close reported.
func (t *Tier) reapDead() bool {
	ended := t.ended
	t.ended = nil
	reaped := false
	for _, s := range ended {
		id := s.PeerID()
		if t.sessions[id] != s {
			continue // forgotten already
		}
		reaped = true
		// One line per ended session, unless the session logged its own
		// cause already (a rejection, a protocol error, a timeout).
		cause, unsure, unreached := s.ConnectFailed()
		switch {
		case unreached: // its episode's line says why
			if cause == "" {
				cause = control.CauseTimeout
			}
			t.connectFailed(id, cause, unsure, s.DeathReason())
		case s.DeathLogged():
		case s.Orderly():
			t.peerInfo(s, "peer %s: %s; session closed", id, s.DeathReason())
		default:
			t.logf("WARNING", "peer %s: %s; session closed", id, s.DeathReason())
		}
		t.observeEnded(s)
		t.refused.ended(s, t.now())
		for _, req := range t.requests {
			if req.pull != nil && req.pull.uses(s) {
				t.markStale(req.pull) // its answers may change without it
			}
		}
		s.Close(s.DeathReason())
		delete(t.sessions, id)
		delete(t.active, s)
		t.unbindServing(s)
		t.dropInbound(s)
		t.reg.remove(id)
		t.dropOutbox(id)
		if s.RejectCause() == session.CauseTimeout {
			// Never take this connection back: the handshake got no answer
			// on it (say, one the peer's ROUTER never reads).
			t.redial(id)
		} else {
			t.ctl.Disconnect(id)
		}
		t.stats.sessionsClosed++
	}
	return reaped
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
		t.observeLoad(ok, t.now().Sub(j.at))
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
	// The one place results are queued for GetFinished.
	t.finished = append(t.finished, JobResult{
		JobID: jobID, Success: ok, IsLoad: j.isLoad, Bytes: bytes, Duration: t.now().Sub(j.at),
	})
	t.news.bump(NewsResults)
	t.notify.signal()
}

// usable is nil while host calls may change state, else why not.
func (t *Tier) usable() error {
	if t.poisoned != nil {
		return t.poisoned
	}
	if t.closed {
		return ErrClosed
	}
	return nil
}

// recoverLoop turns a panic in one of our goroutines into a poisoned peer:
// its state is unknown, so it stops, and every job still outstanding is
// reported failed (once) so the host recomputes instead of waiting forever.
func (t *Tier) recoverLoop(where string) {
	r := recover()
	if r == nil {
		return
	}
	t.logf("ERROR", "internal error in %s: %v; this peer stops serving and fails its jobs (restart the engine)\n%s",
		where, r, debug.Stack())
	t.poison(fmt.Errorf("%w: %s panicked (%v); the peer is stopped", ErrInternal, where, r))
}

// poison stops the peer for good after an internal failure.
func (t *Tier) poison(cause error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	first := t.poisoned == nil
	if first {
		t.poisoned = cause
		t.logf("ERROR", "%v", cause)
	}
	t.closed = true
	for id := range t.jobs {
		t.report(id, false, 0)
	}
	t.guardMu.Lock()
	clear(t.expected) // no peer may write our rows any more
	clear(t.owed)
	t.guardMu.Unlock()
	// Sessions are dropped, not closed: their state is what may be broken.
	clear(t.sessions)
	clear(t.active)
	clear(t.obs.sessionPath)
	clear(t.obs.peers)
	t.pending = nil
	clear(t.serving)
	t.parkedBatches = 0
	clear(t.lookups)
	t.inbound = inboundQueue{}
	if first { // wake the host once: collect the failed jobs; new work fails
		t.failCachedPulls()
		t.news.bumpAll()
		t.notify.signal()
	}
}

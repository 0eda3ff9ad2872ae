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

// Tier is one peer. See the package comment for the threading model.
type Tier struct {
	cfg    config.Config
	region data.Region
	ctl    control.Transport
	dt     data.Transport
	rows   *rowsum.Writer // starts dt's writes, summing those of verified pulls
	checks checker        // verified loads' row checks under way (verify.go)
	now    func() time.Time
	host   *hostSide // what the host learns without calling in: log, news, notification fd (hostside.go)
	gate   hostGate  // how host calls do without the lock while a goroutine holds it (hostgate.go)

	mu   sync.Mutex
	life lifecycle // open, closed or poisoned; the goroutines' stop (lifecycle.go)
	// book holds the host's requests, their pulls and loads, and the row
	// guard (pullbook.go).
	book *pullBook
	// peers holds the sessions and what is kept per peer (peerset.go).
	peers  *peerSet
	ledger *ledger    // jobs and their results (ledger.go)
	desk   *serveDesk // what we serve: PD kv ids, inbound lookups, the outbox (servedesk.go)
	intake intake     // what sessions and goroutines hand the coordinator: reports, lanes, the loop's inbox (intake.go)
	// telemetry: counters and observations (observe.go). Embedded only so
	// that t.stats and t.obs keep naming its parts (verify.go, changed
	// elsewhere at the same time, writes both); its methods are called as
	// t.telemetry's.
	telemetry
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
		cfg:       cfg,
		region:    region,
		ctl:       deps.Control,
		now:       now,
		host:      newHostSide(now),
		gate:      hostGate{wait: defaultHostWait, starveAfter: hostStarveAfter},
		checks:    checker{done: make(chan checked, 64)},
		intake:    newIntake(cfg.MaxFrameBytes),
		telemetry: newTelemetry(),
		life:      lifecycle{stop: make(chan struct{}), loopDone: make(chan struct{})},
	}
	t.ledger = newLedger(now, t.logf, &t.stats, func(r JobResult) {
		if r.IsLoad {
			t.telemetry.loadTook(r.Success, r.Duration)
		}
		t.host.tell(NewsResults, true)
	})
	t.desk = newServeDesk(cfg, now, t.logf, t.ledger.report, &t.stats, func() {
		t.host.tell(NewsInbound, true)
	})
	t.book = newPullBook(t.bookHooks(), cfg.LoadTimeout, cfg.KeyLen, region.RowLen, region.NumRows(), !cfg.NoVerifyPulls)
	dt, err := deps.NewData(t.book.guard, t.logf)
	if err != nil {
		return nil, err
	}
	t.dt = dt
	t.rows = rowsum.NewWriter(dt, region)
	t.logf("INFO", "data paths %s (TCP listener %q)", dt.Name(), dt.DataAddr())
	env := &session.Env{
		LocalID:        deps.Control.LocalID(),
		Epoch:          newEpoch(),
		Cfg:            cfg,
		Region:         region,
		Data:           dt,
		Rows:           t.rows,
		Now:            now,
		Send:           t.sessionSend,
		Report:         t.intake.report,
		Logf:           t.host.logLimited, // a peer, even a stranger, can make a session log: every level rate-limited
		NextLookupID:   t.desk.nextLookupID,
		LookupAnswered: t.lookupAnswered,
		LookupServed:   t.telemetry.servedLookup,
		Register:       t.register,
		Busy:           func(s *session.Session) { t.peers.busy(s) },
		Keys:           &session.KeyBudget{},
	}
	reg := newRegistry(registryDeps{
		dt: dt, stop: t.life.stop, registered: t.intake.registered, crashed: t.crashed, logPath: t.logPath,
	})
	t.peers = newPeerSet(peerDeps{
		cfg: cfg, env: env, now: now, ctl: deps.Control, logf: t.host.logf, peerInfo: t.host.peerInfo,
		send: t.send, settle: t.settle, onLoop: t.onLoop,
	}, adm, reg)
	go reg.run()
	if h, ok := deps.Control.(control.Handing); ok {
		h.Hand(t.handle) // frames are taken on the transport's goroutine; Events then only closes
	}
	go t.loop()
	go t.runOutbox()
	go t.runLanes()
	return t, nil
}

// register is the sessions' Env.Register: a TCP data address outside
// allowed_peers is dropped, and counted.
func (t *Tier) register(s *session.Session, info data.PeerInfo) {
	if t.peers.register(s, info) {
		t.telemetry.rejected(CauseNotAllowed)
	}
}

// mayDial is nil when peerID may be dialed, else errNotAllowed, counted
// and logged.
func (t *Tier) mayDial(peerID string) error {
	err := t.peers.mayDial(peerID)
	if err != nil {
		t.telemetry.rejected(CauseNotAllowed)
	}
	return err
}

// LocalID is this node's identity "host:port".
func (t *Tier) LocalID() string { return t.ctl.LocalID() }

// bookHooks is what the pull book is given of the coordinator; each runs
// with t.mu held, as the book's methods do.
func (t *Tier) bookHooks() bookHooks {
	return bookHooks{
		now:    t.now,
		closed: func() bool { return t.life.closed },
		sessionFor: func(peerID string) (sourceSession, error) {
			s, err := t.sessionFor(peerID)
			if err != nil {
				return nil, err // no typed nil in the interface
			}
			return s, nil
		},
		report: t.ledger.report,
		fence: func(peerID string) {
			if f, ok := t.dt.(data.Fencer); ok {
				f.Fence(peerID)
			}
		},
		fetched:     func(r session.Report, bytes int64, took time.Duration) { t.peers.fetched(r.Session, bytes, took) },
		answersNews: func(wake bool) { t.host.tell(NewsAnswers, wake) },
		logf:        t.host.logf,
	}
}

func (t *Tier) send(peerID string, m protocol.Message) error {
	if t.desk.outbox.deferSend(peerID, m) {
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
		t.desk.outbox.drop(peerID) // the session ends: what waited for it is moot
		s := t.peers.session(peerID)
		if s != nil && !s.Dialed() && !s.Ready() && !t.life.closed { // at shutdown nothing can loop
			if seen, ok := s.Seen(); ok && !seen.PeerKV && !t.peers.goodbyeNow(peerID) {
				return nil // owed: sent at the end of the pace
			}
		}
	}
	t.peers.sent(peerID, m)
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
		t.host.peerInfo(s, "peer %s: data path %s", peerID, t.dt.Name())
		return
	}
	if why := m.Refused(peerID); why != "" {
		t.logf("WARNING", "peer %s: data path %s; not faster ones: %s", peerID, m.PathTo(peerID), why)
		return
	}
	t.host.peerInfo(s, "peer %s: data path %s", peerID, m.PathTo(peerID))
}

// loop is the progress goroutine: inbound frames, transfer completions,
// registrations and deadlines.
func (t *Tier) loop() {
	defer close(t.life.loopDone)
	defer t.recoverLoop("the progress loop")
	tick := time.NewTicker(t.cfg.Tick)
	defer tick.Stop()
	events := t.ctl.Events()
	completions := t.rows.Completions()
	for {
		select {
		case <-t.life.stop:
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
				if s := t.peers.session(c.PeerID); s != nil {
					s.Complete(c)
				}
			})
		case c := <-t.checks.done:
			t.locked(func() { t.verdict(c) })
		case r := <-t.intake.registered:
			t.locked(func() {
				if r.err == nil {
					t.observeRegistered(r.s)
				}
				r.s.RegistrationDone(r.err)
				t.peers.setUp(r.s)
			})
		case f := <-t.intake.found:
			t.locked(f)
		case <-t.book.registerWake:
			more := false
			t.locked(func() {
				t.takeQueued()
				more = t.book.registerSome()
				t.flushLookups()
			})
			if more {
				t.book.wakeRegister() // after the events that came meanwhile
			}
		case <-tick.C:
			t.locked(t.onTick)
		}
	}
}

// locked runs f under the lock, then settles what f set off.
func (t *Tier) locked(f func()) {
	t.mu.Lock()
	defer t.gate.retell(t.host) // after the unlock: what a host call missed meanwhile
	defer t.mu.Unlock()
	if t.life.closed {
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
	s := t.peers.session(ev.PeerID)
	if s == nil {
		if err != nil || m.MsgType() != protocol.TypeConnect {
			t.dropSessionless(ev.PeerID, describe(m, err))
			return
		}
		// A stock peer's connect may be the one our goodbye drew (refusals.go).
		stock := m.(*protocol.Connect).PeerKV == nil
		quiet := stock && t.peers.quietRefusal(ev.PeerID)
		if why := t.peers.admit(ev.PeerID, ev.Addr); why != "" {
			t.refuseBeforeSession(ev.PeerID, ev.Addr, why, stock, quiet)
			return
		}
		s = t.peers.open(ev.PeerID, ev.Addr, false)
		t.peers.noteSpelling(ev.PeerID, ev.Addr)
		t.peers.cancelGoodbye(ev.PeerID) // a goodbye still owed would end this session
		if quiet {
			s.RefuseQuietly()
		}
	}
	if !t.fromSource(s, ev) {
		return
	}
	if err == nil && t.replaceRestarted(s, m) {
		// As for any new session a connect opens (above).
		quiet := m.(*protocol.Connect).PeerKV == nil && t.peers.quietRefusal(ev.PeerID)
		s = t.peers.open(ev.PeerID, ev.Addr, false)
		t.peers.cancelGoodbye(ev.PeerID)
		if quiet {
			s.RefuseQuietly()
		}
	}
	t.peers.heard(s, m, err)
	if err != nil {
		t.stats.badFrames++
		s.HandleDecodeError(err)
		return
	}
	if m.MsgType() == protocol.TypeConnect {
		t.peers.heardFrom(ev.PeerID) // reachable: any back-off is over
	}
	s.Handle(m)
	t.peers.setUp(s)
}

// refuseBeforeSession refuses a connect admit turned away. A peerkv peer
// gets its goodbye at once; a stock peer's goodbyes are paced, and none
// answers the connect our own goodbye drew (refusals.go).
func (t *Tier) refuseBeforeSession(peerID, addr, why string, stock, quiet bool) {
	t.stats.sessionsRefused++
	switch {
	case peerID == t.LocalID():
		t.telemetry.rejected(session.CauseIdentity)
	case why == whyNotAllowed:
		t.telemetry.rejected(CauseNotAllowed)
	default:
		t.telemetry.rejected(CauseLimit)
	}
	if why == whyNotAllowed {
		t.peers.refusedConnect(peerID, addr, why)
	} else {
		t.logf("WARNING", "refusing peer %s (from %s): %s", peerID, addr, why)
	}
	if peerID == t.LocalID() || quiet {
		return
	}
	if !stock || t.peers.goodbyeNow(peerID) {
		t.peers.sayGoodbye(peerID)
	}
}

func describe(m protocol.Message, err error) string {
	if err != nil {
		return err.Error()
	}
	return string(m.MsgType())
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
	if s := t.peers.session(peerID); s != nil {
		if !s.Dead() {
			return s, nil
		}
		t.settle() // close it (its jobs reported) before a new one takes its place
	}
	if peerID == t.LocalID() {
		return nil, errors.New("a peer cannot pull from itself")
	}
	if probing {
		return t.peers.dialProbe(peerID)
	}
	return t.peers.dial(peerID)
}

func (t *Tier) onTick() {
	now := t.now()
	t.peers.tick(now)
	t.desk.tick(now)
	t.book.tickLoads(now)
	t.peers.expireEpisodes(now)
	t.host.flushLogs(now)
	t.peers.sayDueGoodbyes(now)
	t.peers.reapIdle(now)
	t.keepWarm(now)
}

// recoverLoop turns a panic in one of our goroutines into a poisoned peer:
// its state is unknown, so it stops, and every job still outstanding is
// reported failed (once) so the host recomputes instead of waiting forever.
func (t *Tier) recoverLoop(where string) {
	if r := recover(); r != nil {
		t.crashed(where, r)
	}
}

// crashed poisons the tier after a panic r in where (recovered there).
func (t *Tier) crashed(where string, r any) {
	t.logf("ERROR", "internal error in %s: %v; this node stops serving and fails its jobs (restart the engine)\n%s",
		where, r, debug.Stack())
	t.poison(fmt.Errorf("%w: %s panicked (%v); the peer is stopped", ErrInternal, where, r))
}

// poison stops the peer for good after an internal failure.
func (t *Tier) poison(cause error) {
	t.mu.Lock()
	defer t.gate.retell(t.host) // after the unlock: what a host call missed meanwhile
	defer t.mu.Unlock()
	first := t.life.poison(cause)
	if first {
		t.logf("ERROR", "%v", cause)
	}
	t.applyQueuedAnswers(t.gate.answers.take()) // unusable now: their pins are reported failed
	t.teardown(endPoisoned)                     // sessions dropped, not closed: their state is what may be broken
	if first {                                  // wake the host once: collect the failed jobs; new work fails
		t.book.failAll()
		t.host.stopped()
	}
}

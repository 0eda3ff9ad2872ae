package tier

import (
	"errors"
	"fmt"
	"time"

	"github.com/peerkv/peerkv/core/params"
)

// StartRequest parses a request's kv_transfer_params and, for a consumer,
// starts connecting to its sources in the background.
func (t *Tier) StartRequest(reqID string, kvParams []byte) (Policy, error) {
	p, err := params.Parse(kvParams, t.cfg.MaxSourcesPerRequest)
	t.lockHost()
	defer t.unlockHost()
	if err := t.life.usable(); err != nil {
		return BlockLevel, err
	}
	if err != nil {
		t.stats.badParams++
		return BlockLevel, fmt.Errorf("%w: request %s: %v", ErrBadParams, reqID, err)
	}
	if t.book.request(reqID) != nil {
		return BlockLevel, fmt.Errorf("%w: request %s already started", ErrDuplicate, reqID)
	}
	if t.book.start(reqID, p.Dest, p.Sources) {
		t.settle() // a session that died opening (its connect unsendable) is forgotten now
	}
	if p.Dest != nil {
		t.desk.claim(p.Dest.KVRequestID)
		// The decoder needs every block, including prefix hits already in
		// the CPU tier (vLLM #52808).
		return RequestLevel, nil
	}
	return BlockLevel, nil
}

// Lookup answers from local state only; see peerkv_lookup. While the lock
// stays held it answers RETRY for every key (hostgate.go).
func (t *Tier) Lookup(reqID string, keys [][]byte, out []LookupResult) error {
	if len(out) != len(keys) {
		return fmt.Errorf("%w: %d results for %d keys", ErrInvalidArgument, len(out), len(keys))
	}
	if err := t.checkKeys(keys); err != nil {
		return err
	}
	if !t.lockForHost(true) { // it registers keys only the lock's holder can: like a collecting call
		for i := range out {
			out[i] = Retry // nothing allocated: an allocating call may be made to help the GC
		}
		return nil
	}
	defer t.unlockHost()
	r := t.book.request(reqID)
	for i, k := range keys {
		out[i] = t.book.lookupKey(r, k)
	}
	return nil
}

// OnScheduleEnd sends the lookups registered this step; while the lock
// stays held, the progress loop sends them (hostgate.go).
func (t *Tier) OnScheduleEnd() error {
	if !t.lockForHost(false) {
		t.book.wakeRegister() // the loop's wake-up registers the queued keys and flushes
		return nil
	}
	defer t.unlockHost()
	t.flushLookups()
	return nil
}

// flushLookups sends the lookups registered since the last flush. Called
// with t.mu held.
func (t *Tier) flushLookups() {
	if t.life.closed {
		return
	}
	dead := false
	for s := range t.peers.activeSessions { // a quiet session holds no request, so no lookup
		s.FlushLookups()
		dead = dead || s.Dead()
	}
	if dead { // a send failed: report its jobs now, not at the next tick
		t.settle()
	}
}

// SubmitLoad pulls keys from the request's sources into slots.
func (t *Tier) SubmitLoad(reqID string, jobID int64, keys [][]byte, slots []int64) error {
	rows, err := t.checkJob(keys, slots)
	if err != nil {
		return err
	}
	t.lockHost()
	defer t.unlockHost()
	j, err := t.admitJob(jobID, true, rows)
	if err != nil {
		return err
	}
	if t.book.submitLoad(reqID, jobID, j.at, keys, rows) {
		t.settle()
	}
	return nil
}

// SubmitStore serves stored rows to the decoder of a prefill request.
func (t *Tier) SubmitStore(reqID string, jobID int64, keys [][]byte, slots []int64) error {
	rows, err := t.checkJob(keys, slots)
	if err != nil {
		return err
	}
	t.lockHost()
	defer t.unlockHost()
	if _, err := t.admitJob(jobID, false, rows); err != nil {
		return err
	}
	r := t.book.request(reqID)
	if r == nil || r.dest == nil || len(keys) == 0 {
		t.ledger.report(jobID, true, 0) // nobody will fetch these: nothing to keep
		return nil
	}
	t.desk.store(r.dest.KVRequestID, jobID, copyKeys(keys), rows)
	t.settle()
	return nil
}

// GetFinished moves up to max finished jobs out; none while the lock
// stays held (hostgate.go).
func (t *Tier) GetFinished(max int) []JobResult {
	if !t.lockForHost(true) {
		t.missedNews(NewsResults)
		return nil
	}
	defer t.unlockHost()
	return t.ledger.take(max)
}

// FinishRequest ends a request's roles; its jobs are still reported.
func (t *Tier) FinishRequest(reqID string) error {
	t.lockHost()
	defer t.unlockHost()
	if t.life.closed {
		return nil
	}
	r := t.book.finish(reqID)
	if r == nil {
		return nil
	}
	if dst := r.dest; dst != nil {
		t.desk.finishServing(dst.KVRequestID)
	}
	t.settle()
	return nil
}

// HasPendingWork is true while the host must keep calling in, and while
// the lock stays held (hostgate.go).
func (t *Tier) HasPendingWork() bool {
	if !t.lockForHost(false) {
		return true
	}
	defer t.unlockHost()
	if t.life.closed {
		return t.ledger.unreported() > 0
	}
	if t.ledger.inFlight() > 0 || t.ledger.unreported() > 0 || t.desk.pending() {
		return true
	}
	for s := range t.peers.activeSessions { // a quiet session has none
		if s.HasPendingWork() {
			return true
		}
	}
	return false
}

// Drain waits until every submitted job has finished, up to DrainTimeout.
func (t *Tier) Drain() error {
	deadline := t.now().Add(t.cfg.DrainTimeout)
	for {
		t.mu.Lock()
		n := t.inFlight()
		t.unlockHost()
		if n == 0 {
			return nil
		}
		if !t.now().Before(deadline) {
			return fmt.Errorf("%w: %d jobs still in flight after %v", ErrTimeout, n, t.cfg.DrainTimeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// inFlight counts what a drain waits for: loads, and writes in flight. Rows
// parked or pinned for a peer that has not fetched yet wait for the peer, not
// for a transfer, and stay reported by their own deadlines (as upstream).
func (t *Tier) inFlight() int {
	n := 0
	for _, j := range t.ledger.all() {
		if j.isLoad {
			n++
		}
	}
	for s := range t.peers.all {
		if s.TransfersInFlight() {
			n++
		}
	}
	return n
}

// Shutdown stops the peer; see peerkv_shutdown. Any number of goroutines
// may call it at once: each returns only after the one teardown finished.
func (t *Tier) Shutdown() error {
	t.life.shutdownOnce.Do(func() { t.life.shutdownErr = t.shutdown() })
	return t.life.shutdownErr
}

func (t *Tier) shutdown() error {
	// Let writes in flight finish so no row is read after the host reuses it.
	deadline := t.now().Add(t.cfg.ShutdownDrainTimeout)
	for t.now().Before(deadline) && t.transfersInFlight() {
		time.Sleep(time.Millisecond)
	}
	t.mu.Lock()
	t.applyQueuedAnswers(t.gate.answers.take()) // their pins are the jobs of a lookup answered before the end
	t.life.close()
	sessions, owed := t.teardown(endShutdown)
	t.book.failAll()
	t.host.stopped() // once: the host collects the failed jobs and stops waiting
	t.mu.Unlock()
	t.gate.retell(t.host) // what a host call missed meanwhile: the loop is stopping
	if sessions+owed > 0 {
		// Peers read our goodbye on one connection and see our sockets close
		// on another: give the goodbye a head start, so they log an orderly
		// end rather than a lost connection.
		time.Sleep(min(goodbyeGrace, t.cfg.ShutdownDrainTimeout))
	}
	close(t.life.stop)
	<-t.life.loopDone
	t.checks.running.Wait()
	<-t.desk.outbox.done
	<-t.intake.lanes.done
	<-t.peers.reg.done
	errs := []error{t.ctl.Close(), t.rows.Close()}
	return errors.Join(errs...)
}

// goodbyeGrace is how long shutdown waits after its goodbyes before the
// control transport closes.
const goodbyeGrace = 100 * time.Millisecond

func (t *Tier) transfersInFlight() bool {
	t.mu.Lock()
	defer t.unlockHost()
	for s := range t.peers.all {
		if s.TransfersInFlight() {
			return true
		}
	}
	return false
}

// admitJob records a new job while the peer takes work; called with t.mu
// held.
func (t *Tier) admitJob(jobID int64, isLoad bool, rows []uint64) (*job, error) {
	if err := t.life.usable(); err != nil {
		return nil, err
	}
	return t.ledger.admit(jobID, isLoad)
}

func (t *Tier) checkJob(keys [][]byte, slots []int64) ([]uint64, error) {
	if len(keys) != len(slots) {
		return nil, fmt.Errorf("%w: %d keys but %d slots", ErrInvalidArgument, len(keys), len(slots))
	}
	if err := t.checkKeys(keys); err != nil {
		return nil, err
	}
	return t.checkSlots(slots)
}

func (t *Tier) checkKeys(keys [][]byte) error {
	for i, k := range keys {
		if !t.keyLenOK(len(k)) {
			return fmt.Errorf("%w: keys[%d] has %d bytes, want %d (option key_len)", ErrInvalidArgument, i, len(k), t.cfg.KeyLen)
		}
	}
	return nil
}

// keyLenOK is the one rule for a key's length: not empty, and the option
// key_len when it is set (0 takes any).
func (t *Tier) keyLenOK(n int) bool { return n > 0 && (t.cfg.KeyLen == 0 || n == t.cfg.KeyLen) }

func (t *Tier) checkSlots(slots []int64) ([]uint64, error) {
	n := t.region.NumRows()
	rows := make([]uint64, len(slots))
	for i, s := range slots {
		if s < 0 || uint64(s) >= n {
			return nil, fmt.Errorf("%w: slots[%d]=%d is outside the region's %d rows", ErrInvalidArgument, i, s, n)
		}
		rows[i] = uint64(s)
	}
	return rows, nil
}

func copyKeys(keys [][]byte) [][]byte {
	out := make([][]byte, len(keys))
	for i, k := range keys {
		out[i] = append([]byte(nil), k...)
	}
	return out
}

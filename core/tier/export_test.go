package tier

import (
	"context"
	"net"
	"time"
)

// PanicNext makes the named goroutine ("loop" or "registration") panic on
// its next step.
func PanicNext(where string) { panicAt.Store(&where) }

// InlineAsk is how many keys a host call registers itself (more are left to
// the loop).
const InlineAsk = inlineAsk

// FramesDecoded is how many inbound frames were decoded past their type.
func (t *Tier) FramesDecoded() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stats.framesDecoded
}

// StubResolver makes dialed host names resolve to addrs until restore.
func StubResolver(addrs map[string][]string) (restore func()) {
	prev := resolveHost
	resolveHost = func(_ context.Context, host string) ([]string, error) {
		if a, ok := addrs[host]; ok {
			return a, nil
		}
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return func() { resolveHost = prev }
}

// BeforeCheck runs f before each verified load's rows are checked where
// they landed.
func (t *Tier) BeforeCheck(f func(rows []uint64)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.checks.before = f
}

// WriteAsPeer writes src into row as a data path writing for peerID
// would: through the row guard, refused unless the row is owed to peerID.
func (t *Tier) WriteAsPeer(peerID string, row uint64, src []byte) bool {
	return t.book.guard.WriteRow(peerID, row, t.region.Row(row), src)
}

// RowsReread is how many rows verified loads' checks read again (rows
// without a landed sum, or every row once something may write around the
// row guard).
func (t *Tier) RowsReread() int64 { return t.checks.reread.Load() }

// BeforeSend runs f after each summed write's sums were taken and before
// its transfer starts.
func (t *Tier) BeforeSend(f func(peerID string, src []uint64)) { t.rows.SetBeforeSend(f) }

// HoldLock takes the tier's lock on a goroutine of its own, as a preempted
// holder would keep it, and returns once it is held; release lets it go.
func (t *Tier) HoldLock() (release func()) {
	held, done := make(chan struct{}), make(chan struct{})
	go func() {
		t.mu.Lock()
		close(held)
		<-done
		t.mu.Unlock()
	}()
	<-held
	return func() { close(done) }
}

// WaitForTheLock makes host calls wait for the lock as long as it is held,
// as they did before the gate (hostgate.go): for tests that assert what
// one call answers on a loaded machine. Call before the first host call.
func (t *Tier) WaitForTheLock() { t.gate.wait = -1 }

// GateWaits makes host calls try for the lock for at most the gate's
// default wait again, and never join its waiters (the tests hold the lock
// themselves until the calls returned).
func (t *Tier) GateWaits() { t.gate.wait, t.gate.starveAfter = defaultHostWait, time.Hour }

// GateJoinsWaitersAfter is GateWaits, joining the lock's waiters after d
// without it.
func (t *Tier) GateJoinsWaitersAfter(d time.Duration) {
	t.gate.wait, t.gate.starveAfter = defaultHostWait, d
}

// HostCallsDeferred is how many host calls did without the lock.
func (t *Tier) HostCallsDeferred() int64 { return t.gate.deferred.Load() }

package tier

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/peerkv/peerkv/core/session"
)

// Host calls run on vLLM's scheduler thread, which must never wait on the
// network. The tier's lock is also taken by goroutines (the control pump,
// the progress loop, the lanes), and on a loaded host the kernel or Go's
// scheduler can preempt one of them while it holds the lock: holds of a few
// microseconds of work then last tens of milliseconds. So the host calls
// made every step try the lock for at most the gate's wait, and when it is
// still held they do without it:
//
//   - calls that collect (GetFinished, TakeAnswers, NextInbound) return
//     nothing this time, and the news count of what they could not collect
//     moves again (waking the host) as soon as the lock's holder is done,
//     so the host comes back for it next step: nothing is lost or reported
//     twice, only collected a step later;
//   - Lookup answers RETRY for every key (ask again next step), allocating
//     nothing: a call that allocates while the GC runs can be made to wait
//     for it;
//   - LookupMany answers RETRY for every key and queues the keys; the next
//     holder registers them as the call would have (askQueue), and queues
//     every answer other than RETRY as a change, as for a large first ask
//     (asked.go);
//   - OnScheduleEnd (and LookupMany's part of it) leaves the flush to the
//     progress loop;
//   - AnswerInbound queues the answer to the Evaluate item handed out last
//     and says the lookup is not finished; the next holder applies it, and
//     queues the Finish item the host is then owed (answerQueue);
//   - HasPendingWork says true.
//
// After starveAfter without the lock, the next call that collects (or, for
// Lookup, registers) waits for it once: Go's mutex hands the lock to its
// waiters in turn once one waited a millisecond, and a TryLock never gets
// it then. The other calls never wait: their work is queued for the
// holder, or they have none.
//
// Calls made once per request or job (StartRequest, LookupMode, SubmitLoad,
// SubmitStore, FinishRequest) still wait: what they return depends on state
// only the lock's holder may read. They apply what was queued first, so a
// request's keys keep the order it asked them in.
// Strangers never take the lock (intake.go): only peers with a session,
// and our own goroutines, can hold it.

// hostGate is how host calls get the tier's lock without waiting on it:
// the bound on a try, the calls that did without it, what they could not
// collect and the lookups they could not register. Safe without the lock.
type hostGate struct {
	// wait bounds how long a host call tries for the lock. It spins rather
	// than sleeps: a sleeping call would wait for Go's scheduler to run it
	// again, which on a busy host takes as long as the lock's holder. Set
	// before the first host call, never changed after.
	wait     time.Duration
	deferred atomic.Int64  // host calls that did without the lock
	owed     atomic.Uint32 // bit k: news kind k is to be told again (retell)
	asks     askQueue
	answers  answerQueue
	// lastStats is the last document HostStats built, what it returns
	// while the lock stays held.
	lastStats atomic.Pointer[Stats]
	// missingSince is when host calls started to do without the lock
	// (Unix ns; 0: the last one held it); past starveAfter, the next one
	// waits for it.
	missingSince atomic.Int64
	lastMiss     atomic.Int64 // Unix ns of the last call without the lock
	starveAfter  time.Duration
}

// defaultHostWait is hostGate.wait: holds of real work take microseconds.
const defaultHostWait = 500 * time.Microsecond

// lockForHost takes the tier's lock if it is free within the gate's wait,
// applying what was queued meanwhile; false means it was not taken (and the
// call is counted as deferred). collects: the call collects work (results,
// answers, inbound items) that only the lock's holder can hand over.
func (t *Tier) lockForHost(collects bool) bool {
	if !t.tryLockFor(t.gate.wait) {
		if starved := t.gate.starved(); !starved || !collects {
			t.gate.deferred.Add(1)
			return false
		}
		// Calls went without the lock for starveAfter: TryLock fails
		// whenever Go's mutex hands the lock to its waiters in turn (after
		// one waited a millisecond), so a collecting call joins them this
		// once. The other calls queue their work, or have none.
		t.mu.Lock()
	}
	t.gate.held()
	t.takeQueued()
	return true
}

// takeQueued applies what host calls queued while they did without the
// lock, in the order they made it; t.mu held.
func (t *Tier) takeQueued() {
	t.book.registerQueued(t.gate.asks.take())
	t.applyQueuedAnswers(t.gate.answers.take())
}

// hostStarveAfter is hostGate.starveAfter: how long host calls do without
// the lock before the next one waits for it.
const hostStarveAfter = time.Second

// held records that a host call holds the lock now (a load, no store, in
// the common case: no clock read on the hot path).
func (g *hostGate) held() {
	if g.missingSince.Load() != 0 {
		g.missingSince.Store(0)
	}
}

// starved says host calls have kept doing without the lock for
// starveAfter: the first call without it starts the count, and so does one
// after a pause of calls (an idle host is not starved).
func (g *hostGate) starved() bool {
	now := time.Now().UnixNano()
	prev := g.lastMiss.Swap(now)
	since := g.missingSince.Load()
	if since == 0 || time.Duration(now-prev) > g.starveAfter/4 {
		g.missingSince.Store(now)
		return false
	}
	return time.Duration(now-since) > g.starveAfter
}

// lockHost takes the tier's lock for a host call that must have it, and
// registers the lookups queued meanwhile first.
func (t *Tier) lockHost() {
	t.mu.Lock()
	t.gate.held()
	t.takeQueued()
}

// tryLockFor takes the lock if it is free within wait; a negative wait
// waits for it (tests that assert what one call answers set it).
func (t *Tier) tryLockFor(wait time.Duration) bool {
	if wait < 0 {
		t.mu.Lock()
		return true
	}
	if t.mu.TryLock() {
		return true
	}
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) {
		if t.mu.TryLock() {
			return true
		}
	}
	return false
}

// missed notes that a host call could not collect news kind k now.
func (g *hostGate) missed(k NewsKind) { g.owed.Or(1 << k) }

// missedNews is missed for a host call that found the lock held. Should
// the holder have let it go since (and told its news before this mark),
// the news is told here, so a miss is never left to a holder that is gone
// (the loop stops with the tier).
func (t *Tier) missedNews(k NewsKind) {
	t.gate.missed(k)
	if t.mu.TryLock() {
		t.mu.Unlock()
		t.gate.retell(t.host)
	}
}

// retell moves the news count of every kind a host call missed, and wakes
// the host. Called by the lock's holders as they let it go (locked), the
// progress loop's tick among them, so a miss is told again within a tick.
func (g *hostGate) retell(h *hostSide) {
	if g.owed.Load() == 0 { // the common case: a load, not a swap
		return
	}
	owed := g.owed.Swap(0)
	for k := NewsKind(0); k < NewsKinds; k++ {
		if owed&(1<<k) != 0 {
			h.news.bump(k)
		}
	}
	h.notify.signal()
}

// handoff holds what host calls made while the lock was held, in order,
// until the next holder takes it all. Its own lock is held only to append
// or to take the whole queue, and an empty queue is seen without it.
type handoff[T any] struct {
	mu    sync.Mutex
	items []T
	count atomic.Int32 // len(items), read without mu
}

// pushIf appends it when fits accepts the queue's length; false if not.
func (q *handoff[T]) pushIf(fits func(n int) bool, it T) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if fits != nil && !fits(len(q.items)) {
		return false
	}
	q.items = append(q.items, it)
	q.count.Store(int32(len(q.items)))
	return true
}

// take empties the queue, returning what it held in order; nil (and no
// lock taken) when it is empty.
func (q *handoff[T]) take() []T {
	if q.count.Load() == 0 {
		return nil
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	items := q.items
	q.items = nil
	q.count.Store(0)
	return items
}

// askQueue holds the keys of lookups made while the lock was held, in the
// order the host asked them, until the next holder registers them as the
// calls would have: the next host call (which must see them registered
// first, so the request's keys keep the order it asked them in), or the
// progress loop, woken for them.
type askQueue struct {
	handoff[queuedAsk]
	bytes atomic.Int64 // the keys' bytes queued, bounded by maxQueuedAskBytes
}

// maxQueuedAskBytes bounds the keys queued by calls that did without the
// lock; past it they wait for the lock instead (LookupMany) or leave the
// keys to the host's next call (Lookup). A step asks at most thousands of
// keys; the loop registers them as soon as the lock is free.
const maxQueuedAskBytes = 16 << 20

// room says whether n more bytes of keys may be queued.
func (q *askQueue) room(n int) bool { return q.bytes.Load()+int64(n) <= maxQueuedAskBytes }

// queuedAsk is one request's keys of one LookupMany.
type queuedAsk struct {
	reqID  string
	keys   []byte
	keyLen int
}

// push queues a copy of the keys of reqID asked by a call that did not
// get the lock.
func (q *askQueue) push(reqID string, keys []byte, keyLen int) {
	if len(keys) == 0 {
		return
	}
	q.bytes.Add(int64(len(keys)))
	q.pushIf(nil, queuedAsk{reqID: reqID, keys: append([]byte(nil), keys...), keyLen: keyLen})
}

// take empties the queue, returning what it held in order.
func (q *askQueue) take() []queuedAsk {
	asks := q.handoff.take()
	for _, a := range asks {
		q.bytes.Add(-int64(len(a.keys)))
	}
	return asks
}

// registerQueued registers the keys host calls queued while they did
// without the lock, in the order they were asked; t.mu held. A LookupMany's
// new keys are registered as a large first ask's are (asked.go), and a key
// it asked again (the host forgets its answers after a load) is answered
// again: either way the host was told RETRY, so every other answer is
// queued as a change. Those of a request whose answers the host does not
// cache (or a PD pull's, all HIT) are registered as the call would have,
// their answers dropped: the host asks again.
func (b *pullBook) registerQueued(asks []queuedAsk) {
	for _, a := range asks {
		r := b.requests[a.reqID]
		if r == nil || r.pull == nil || r.pull.failed || r.pull.told.ended || b.h.closed() {
			continue // its answers are MISS, told as the pull's failure where the host caches them
		}
		p := r.pull
		if !p.told.cached || !p.probe {
			b.registerAsked(p)
			for off := 0; off+a.keyLen <= len(a.keys); off += a.keyLen {
				p.lookup(a.keys[off : off+a.keyLen : off+a.keyLen]) // registered; the host asks again for the answer
			}
			continue
		}
		if len(p.asked) > 0 && p.askedKeyLen != a.keyLen {
			b.registerAsked(p) // keys of another length first: registered in the order asked
		}
		for off := 0; off+a.keyLen <= len(a.keys); off += a.keyLen {
			key := a.keys[off : off+a.keyLen : off+a.keyLen]
			if k := p.byKey[string(key)]; k != nil {
				b.toldRetry(p, k)
				continue
			}
			if len(p.asked) == 0 {
				b.toRegister = append(b.toRegister, p)
			}
			p.asked, p.askedKeyLen = append(p.asked, key...), a.keyLen
		}
	}
}

// toldRetry answers k again for a host that was told RETRY for it, and
// queues the answer as a change unless it is RETRY still (a later change
// of it is queued as any other).
func (b *pullBook) toldRetry(p *pull, k *keyAnswer) {
	k.told = p.answer(k)
	if k.told != Retry {
		b.countAnswer(k.told)
		p.told.changed = append(p.told.changed, int32(k.pos))
		b.queueAnswers(p)
	}
}

// unlockHost lets the lock go at the end of a host call (or of any other
// hold outside locked), then tells what a host call missed meanwhile (the
// progress loop, which would tell it at its next tick, stops with the
// tier).
func (t *Tier) unlockHost() {
	t.mu.Unlock()
	t.gate.retell(t.host)
}

// queuedAnswer is the host's answer to an Evaluate item, made while the
// lock was held (AnswerInbound).
type queuedAnswer struct {
	lookupID int64
	reqID    string // the Evaluate's: the Finish item that follows names it
	answers  []session.Answer
	pinJobID int64
	rows     []uint64
}

// answerQueue holds the answers to Evaluate items made while the lock was
// held, in order, until the next holder applies them. Only the answer to
// the Evaluate handed out last is queued (hosts answer each as they get
// it): its request id is at hand for the Finish item the host is then owed.
type answerQueue struct {
	handoff[queuedAnswer]
	last atomic.Pointer[handout] // the Evaluate handed out last, not answered yet
}

type handout struct {
	lookupID int64
	reqID    string
}

// maxQueuedAnswers bounds the answers queued; past it AnswerInbound waits.
const maxQueuedAnswers = 256

// handedOut records the Evaluate item NextInbound hands the host.
func (g *hostGate) handedOut(lookupID int64, reqID string) {
	g.answers.last.Store(&handout{lookupID: lookupID, reqID: reqID})
}

// queueAnswer queues a when it answers the Evaluate handed out last and
// there is room; false means the caller must apply it itself.
func (g *hostGate) queueAnswer(a queuedAnswer) bool {
	q := &g.answers
	last := q.last.Load()
	if last == nil || last.lookupID != a.lookupID || !q.last.CompareAndSwap(last, nil) {
		return false // not the Evaluate handed out last (or answered already)
	}
	a.reqID = last.reqID
	return q.pushIf(func(n int) bool { return n < maxQueuedAnswers }, a)
}

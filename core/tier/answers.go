package tier

import "fmt"

// A host may cache our lookup answers (peerkv_request_lookup_mode,
// peerkv_lookup_many, peerkv_take_answers): it answers vLLM's per-key
// lookups from what it was told, sends the keys it never asked in one call
// per step, and asks what changed only when the answers news count moved.
// It never asks again about a key it was told RETRY, so the tier
// re-evaluates those keys itself whenever their sources answer (or fail),
// and queues what changed for TakeAnswers.

// LookupMode says how a request's lookups are answered.
type LookupMode int32

const (
	LookupsMiss LookupMode = 0 // every key MISS (the request does not pull, or it failed)
	LookupsHit  LookupMode = 1 // every key HIT until a load fails (a PD decoder)
	LookupsAsk  LookupMode = 2 // keys are asked of the sources (remote_kv_source)
)

// toldState is what a caching host was told about one pull beyond each
// key's told answer; its lifecycle is the pull's.
type toldState struct {
	reqID   string
	cached  bool    // the host caches answers (it asked for the lookup mode)
	stale   bool    // in the book's stale: re-evaluated at the end of this settle
	queued  bool    // in the book's answered: changes wait for TakeAnswers
	changed []int32 // positions (in order) whose told answer changed since the last take
	failed  bool    // the host is to be told the pull failed (every key MISS)
	ended   bool    // the request finished: nothing more is told
}

// AnswerChange is what changed for one request since the last TakeAnswers.
type AnswerChange struct {
	ReqID  string
	Failed bool // every key of the request is MISS from now on
	// Positions index the request's keys in the order it first asked about
	// them; Results[i] is the answer for Positions[i] now.
	Positions []int32
	Results   []LookupResult
}

// RequestKeys is one request's part of a LookupMany: its keys back to back,
// each of the call's key length, as the host passes them.
type RequestKeys struct {
	ReqID string
	Keys  []byte
}

// count is how many keys rk holds, each keyLen bytes.
func (rk RequestKeys) count(keyLen int) int { return len(rk.Keys) / keyLen }

// key is rk's i-th key, capped so an append cannot write into the next one.
func (rk RequestKeys) key(i, keyLen int) []byte {
	return rk.Keys[i*keyLen : (i+1)*keyLen : (i+1)*keyLen]
}

// LookupMode tells a host that caches answers how reqID's lookups go, and
// from then on queues the request's changed answers for TakeAnswers.
func (t *Tier) LookupMode(reqID string) LookupMode {
	t.lockHost()
	defer t.unlockHost()
	if t.life.closed {
		return LookupsMiss
	}
	return t.book.lookupMode(reqID)
}

// lookupMode is LookupMode's part on the request's pull.
func (b *pullBook) lookupMode(reqID string) LookupMode {
	r := b.requests[reqID]
	if r == nil || r.pull == nil || r.pull.failed {
		return LookupsMiss
	}
	r.pull.told.cached = true
	if !r.pull.probe {
		return LookupsHit
	}
	return LookupsAsk
}

// LookupMany is Lookup for the keys of several requests, each keyLen bytes
// (out holds every key's result, in order), then OnScheduleEnd: one call
// per step.
func (t *Tier) LookupMany(batch []RequestKeys, keyLen int, out []LookupResult) error {
	if !t.keyLenOK(keyLen) {
		for _, rk := range batch {
			if len(rk.Keys) > 0 {
				return fmt.Errorf("%w: keys of %d bytes, want %d (option key_len)", ErrInvalidArgument, keyLen, t.cfg.KeyLen)
			}
		}
		keyLen = 1 // no keys at all: only OnScheduleEnd's part runs
	}
	n := 0
	for _, rk := range batch {
		if len(rk.Keys)%keyLen != 0 {
			return fmt.Errorf("%w: request %s: %d bytes of keys is not a whole number of %d-byte keys",
				ErrInvalidArgument, rk.ReqID, len(rk.Keys), keyLen)
		}
		n += rk.count(keyLen)
	}
	if len(out) != n {
		return fmt.Errorf("%w: %d results for %d keys", ErrInvalidArgument, len(out), n)
	}
	if !t.lockForHost(false) {
		if t.gate.asks.room(n * keyLen) {
			for i := range out {
				out[i] = Retry
			}
			for _, rk := range batch {
				t.gate.asks.push(rk.ReqID, rk.Keys, keyLen)
			}
			t.book.wakeRegister() // the loop registers them and flushes
			return nil
		}
		t.lockHost() // the queue is full: wait rather than hold more
	}
	defer t.unlockHost()
	deferred := t.book.lookupMany(batch, keyLen, n, out)
	t.flushLookups() // OnScheduleEnd's part: keys registered by earlier calls go out too
	if deferred {
		t.book.wakeRegister()
	}
	return nil
}

// lookupMany answers the n keys of batch (checked) into out; it reports
// whether first asks were deferred to the loop.
func (b *pullBook) lookupMany(batch []RequestKeys, keyLen, n int, out []LookupResult) (deferred bool) {
	i := 0
	for _, rk := range batch {
		count := rk.count(keyLen)
		res := out[i : i+count]
		i += count
		r := b.requests[rk.ReqID]
		if r != nil && r.pull != nil {
			if n > inlineAsk && b.deferAsk(r.pull, rk.Keys, keyLen, res) {
				deferred = true
				continue
			}
			b.registerAsked(r.pull)
			r.pull.reserve(count, b.keyLen)
		}
		for j := range res {
			res[j] = b.lookupKey(r, rk.key(j, keyLen))
		}
	}
	return deferred
}

// lookupKey answers one host lookup (see peerkv_lookup).
func (b *pullBook) lookupKey(r *request, key []byte) LookupResult {
	if r == nil || r.pull == nil || r.pull.failed || b.h.closed() {
		return Miss
	}
	b.registerAsked(r.pull)
	res := r.pull.lookup(key)
	b.countAnswer(res)
	return res
}

// TakeAnswers moves queued changes out while fits accepts them (in order);
// a change fits refuses stays queued, with those after it.
// None are moved while the lock stays held (hostgate.go).
func (t *Tier) TakeAnswers(fits func(AnswerChange) bool) []AnswerChange {
	if !t.lockForHost(true) {
		t.missedNews(NewsAnswers)
		return nil
	}
	defer t.unlockHost()
	return t.book.takeAnswers(fits)
}

func (b *pullBook) takeAnswers(fits func(AnswerChange) bool) []AnswerChange {
	var out []AnswerChange
	for len(b.answered) > 0 {
		p := b.answered[0]
		if p.told.ended {
			b.answered = b.answered[1:]
			p.told.queued, p.told.changed = false, nil
			continue
		}
		c := AnswerChange{ReqID: p.told.reqID, Failed: p.told.failed}
		if !c.Failed {
			c.Positions = p.told.changed
			c.Results = make([]LookupResult, len(c.Positions))
			for i, pos := range c.Positions {
				c.Results[i] = p.order[pos].told
			}
		}
		if !fits(c) {
			break
		}
		out = append(out, c)
		b.answered = b.answered[1:]
		p.told.queued, p.told.changed = false, nil
	}
	if len(b.answered) == 0 {
		b.answered = nil
	} else {
		b.h.answersNews(false) // what did not fit is news still
	}
	return out
}

// markStale has p re-evaluated at the end of this settle.
func (b *pullBook) markStale(p *pull) {
	if p == nil || !p.told.cached || p.told.ended || p.told.stale {
		return
	}
	p.told.stale = true
	b.stale = append(b.stale, p)
}

// refreshStale re-evaluates every stale pull. Called from settle.
func (b *pullBook) refreshStale() {
	for len(b.stale) > 0 {
		p := b.stale[0]
		b.stale = b.stale[1:]
		p.told.stale = false
		b.refresh(p)
	}
	b.stale = nil
}

// refresh asks again, as the host would next step, about every key the
// host was told RETRY, and queues the answers that changed.
func (b *pullBook) refresh(p *pull) {
	if p.told.ended || b.h.closed() {
		return
	}
	if p.failed {
		if !p.told.failed {
			p.told.failed = true
			b.queueAnswers(p)
		}
		return
	}
	if !p.probe {
		return
	}
	for i, a := range p.order { // keys still deferred are not in order yet: the loop registers them
		if a.told != Retry {
			continue
		}
		if a.told = p.answer(a); a.told != Retry {
			b.countAnswer(a.told)
			p.told.changed = append(p.told.changed, int32(i))
			b.queueAnswers(p)
		}
	}
	// Keys registered again (a source took over from one that ended) go
	// out now: the host sends nothing for keys it was told RETRY.
	for _, src := range p.sources {
		if src.down == "" && src.s != nil {
			src.s.FlushLookup(src.KVRequestID)
		}
	}
}

// failCachedPulls tells a caching host that every request it still holds
// answers for fails (the peer stopped): lookup would answer MISS now, and a
// key it was told RETRY must not wait for an answer that cannot come.
// Called as the peer closes.
func (b *pullBook) failCachedPulls() {
	for _, r := range b.requests {
		if p := r.pull; p != nil && p.told.cached && !p.told.ended && !p.told.failed {
			p.told.failed = true
			b.queueAnswers(p)
		}
	}
}

func (b *pullBook) queueAnswers(p *pull) {
	if p.told.queued {
		return
	}
	p.told.queued = true
	b.answered = append(b.answered, p)
	b.h.answersNews(true) // a host that sleeps on the fd learns of them now
}

// pullIndex finds the pulls a session's report is about by kv id: a pull
// is added when its request starts and removed when it finishes.
type pullIndex map[string][]*pull

func (x pullIndex) add(p *pull) {
	for _, src := range p.sources {
		x[src.KVRequestID] = append(x[src.KVRequestID], p)
	}
}

func (x pullIndex) remove(p *pull) {
	for _, src := range p.sources {
		list := x[src.KVRequestID]
		for i, q := range list {
			if q == p {
				list = append(list[:i], list[i+1:]...)
				break
			}
		}
		if len(list) == 0 {
			delete(x, src.KVRequestID)
		} else {
			x[src.KVRequestID] = list
		}
	}
}

// probesAnswered marks stale the pulls that ask kv of s.
func (b *pullBook) probesAnswered(s sourceSession, kv string) {
	for _, p := range b.pulls[kv] {
		if p.uses(s) {
			b.markStale(p)
			b.releaseServed(p) // a late answer may name only keys that landed
		}
	}
}

// uses reports whether one of p's sources is served by s.
func (p *pull) uses(s sourceSession) bool {
	for _, src := range p.sources {
		if src.s == s {
			return true
		}
	}
	return false
}

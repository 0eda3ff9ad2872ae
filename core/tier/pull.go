package tier

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"github.com/peerkv/peerkv/core/params"
)

// pull is one host request's pull from its sources (remote_prefiller, or
// remote_kv_source's list in the orchestrator's order): the one owner of
// its sources (each with its own session and kv id), of what the host was
// told about each key, and of the request's failure.
type pull struct {
	sources []*pullSource
	probe   bool // remote_kv_source: look keys up first; remote_prefiller: every key is there
	// The host's keys in the order it first asked about them (prompt
	// order): "earlier" for the contiguous-prefix rule. settled is how many
	// leading keys are HIT.
	order   []*keyAnswer
	byKey   map[string]*keyAnswer
	spare   []keyAnswer // allocated ahead for the keys of one host call (reserve)
	keyBuf  []byte      // room for their copies, likewise
	settled int
	// landedKeys counts keys whose rows a successful load wrote.
	landedKeys int
	// failed: a load failed, so every lookup answers MISS and the host
	// recomputes. It belongs to this request alone: a later request reusing
	// a kv id starts clean.
	failed bool
	told   toldState // what the host caches of our answers (answers.go)
	// A first ask answered RETRY and not yet registered (asked.go): its
	// keys back to back, and their length.
	asked       []byte
	askedKeyLen int
}

// pullSource is one source of one request: its own session (a separate
// session to the producer, as a stock vLLM producer expects) and kv id.
type pullSource struct {
	params.Source               // KVRequestID minted when the orchestrator left it out
	minted        bool          // we minted KVRequestID
	s             sourceSession // nil when it could not open
	down          string        // why it no longer serves this request ("" = it does)
}

// keyAnswer is the last answer the host got for one key, from the key's
// own sources (before the prefix rule).
type keyAnswer struct {
	pos  int
	key  []byte
	last LookupResult
	told LookupResult // what the host was told last (it asks again only after RETRY)
	// reported: the sources that reported the key as a hit in any round.
	// A fetch closes its source's round and what it reported there, so a
	// key the host was told HIT before another load's fetch is looked up
	// again at these sources when its own load comes (startLoad).
	reported sourceSet
	// landed: a successful load of this request wrote the key's row.
	landed bool
}

// mintKVID returns a kv_request_id no other consumer can pick: 128 random bits.
func mintKVID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // never fails (crypto/rand)
	return "peerkv-" + hex.EncodeToString(b[:])
}

// startPull opens a session to each source of a starting request; one that
// cannot open is down from the start.
func (b *pullBook) startPull(reqID string, sources []params.Source) *pull {
	p := &pull{probe: sources[0].Probe, byKey: map[string]*keyAnswer{}, told: toldState{reqID: reqID}}
	names := make([]string, 0, len(sources))
	notAllowed := 0
	for _, src := range sources {
		ps := &pullSource{Source: src}
		if ps.KVRequestID == "" {
			ps.KVRequestID, ps.minted = mintKVID(), true
			b.counts.kvIDsMinted++
		}
		s, err := b.h.sessionFor(ps.PeerID())
		if err == nil {
			ps.s = s
		} else {
			ps.down = err.Error()
			if errors.Is(err, errNotAllowed) || errors.Is(err, errUnreachable) { // each has its own line
				notAllowed++
			} else {
				b.h.logf("WARNING", "request %s cannot pull from %s: %v", reqID, ps.PeerID(), err)
			}
		}
		p.sources = append(p.sources, ps)
		how := "given"
		if ps.minted {
			how = "minted"
		}
		names = append(names, fmt.Sprintf("%s (kv_request_id=%s, %s)", ps.PeerID(), ps.KVRequestID, how))
	}
	b.h.logf("INFO", "request %s pulls from %s", reqID, strings.Join(names, ", "))
	if p.live() == 0 {
		p.failed = true
		if notAllowed < len(sources) {
			b.h.logf("WARNING", "request %s has no source it can pull from; it computes locally", reqID)
		}
	}
	return p
}

// live counts the sources still serving the request, marking down those
// whose session ended (the session logs why).
func (p *pull) live() int {
	n := 0
	for _, src := range p.sources {
		if src.down == "" && src.s.Dead() {
			src.down = "its session ended"
		}
		if src.down == "" {
			n++
		}
	}
	return n
}

// lookup answers one key: HIT when a source has it and every earlier key is
// HIT (vLLM loads a contiguous prefix); MISS when no source has it, or an
// earlier key is MISS (the prefix ended: the key is not asked); RETRY while
// that is not known yet. Every live source is asked in the same step.
func (p *pull) lookup(key []byte) LookupResult {
	if !p.probe {
		return Hit // PD: the prefiller has or will have every block
	}
	a := p.byKey[string(key)]
	if a == nil {
		a = p.addKey(p.copyKey(key))
	}
	a.told = p.answer(a)
	return a.told
}

// addKey adds a key byKey does not hold, keeping key itself (which must
// never change) as the record's and the map's key.
func (p *pull) addKey(key []byte) *keyAnswer {
	if len(p.spare) == 0 {
		p.spare = make([]keyAnswer, 1)
	}
	a := &p.spare[0]
	p.spare = p.spare[1:]
	*a = keyAnswer{pos: len(p.order), key: key, last: Retry}
	p.byKey[unsafe.String(unsafe.SliceData(key), len(key))] = a
	p.order = append(p.order, a)
	return a
}

// reserve makes room for n more keys of keyLen bytes at once, copies
// included: one host call asks a whole request's keys, and a step asks
// thousands.
func (p *pull) reserve(n, keyLen int) {
	if n = p.reserveAnswers(n); n > 0 && n*keyLen > cap(p.keyBuf)-len(p.keyBuf) {
		p.keyBuf = make([]byte, 0, n*keyLen)
	}
}

// reserveAnswers makes room for the records of n more keys and returns how
// many of them can be new.
func (p *pull) reserveAnswers(n int) int {
	if !p.probe {
		return 0
	}
	n -= len(p.byKey) // the host asks again from the first key: only the rest is new
	if n <= 0 {
		return 0
	}
	if n > len(p.spare) {
		p.spare = make([]keyAnswer, n)
	}
	if len(p.byKey) == 0 {
		p.byKey = make(map[string]*keyAnswer, n)
		p.order = make([]*keyAnswer, 0, n)
		for _, src := range p.sources {
			if src.down == "" {
				src.s.ReserveLookups(src.KVRequestID, n)
			}
		}
	}
	return n
}

// copyKey is the pull's own copy of a host key, which the sessions keep too.
func (p *pull) copyKey(key []byte) []byte {
	if len(key) > cap(p.keyBuf)-len(p.keyBuf) {
		return append([]byte(nil), key...)
	}
	n := len(p.keyBuf)
	p.keyBuf = append(p.keyBuf, key...)
	return p.keyBuf[n:len(p.keyBuf):len(p.keyBuf)] // full slice: no append reaches a neighbour
}

func (p *pull) answer(a *keyAnswer) LookupResult {
	gate := Hit // the answer of the first earlier key that is not HIT
	if a.pos > p.settled {
		gate = p.order[p.settled].last
	}
	if gate == Miss {
		return Miss
	}
	var hits sourceSet
	a.last, hits = p.ask(a.key)
	a.reported |= hits
	if a.pos < p.settled && a.last != Hit {
		p.settled = a.pos
	}
	for p.settled < len(p.order) && p.order[p.settled].last == Hit {
		p.settled++
	}
	if gate == Retry && a.last == Hit {
		return Retry
	}
	return a.last
}

// ask combines the live sources' answers for key, registering it with
// those that have not been asked, and returns the sources that hold it.
func (p *pull) ask(key []byte) (LookupResult, sourceSet) {
	p.live()
	var hits sourceSet
	pending := false
	for i, src := range p.sources {
		if src.down != "" {
			continue
		}
		h, known := src.s.RegisterLookup(src.KVRequestID, key)
		if h {
			hits = hits.with(i)
		}
		pending = pending || !known
	}
	switch {
	case !hits.empty():
		return Hit, hits
	case pending:
		return Retry, 0
	}
	return Miss, 0
}

// holders is the set of live sources that reported key as a hit in their
// current round (every key, for PD's single source).
func (p *pull) holders(key []byte) sourceSet {
	p.live()
	var set sourceSet
	for i, src := range p.sources {
		if src.down != "" {
			continue
		}
		if hit, _ := src.s.Probed(src.KVRequestID, key); hit || !p.probe {
			set = set.with(i)
		}
	}
	return set
}

// reportedBefore is the set of live sources that reported key as a hit in
// an earlier round (see keyAnswer.reported).
func (p *pull) reportedBefore(key []byte) sourceSet {
	if a := p.byKey[string(key)]; a != nil {
		return a.reported & p.liveSet()
	}
	return 0
}

// liveSet is every source still serving the request.
func (p *pull) liveSet() sourceSet {
	p.live()
	var set sourceSet
	for i, src := range p.sources {
		if src.down == "" {
			set = set.with(i)
		}
	}
	return set
}

// finish ends the request's pull at every source it still has a session
// with: loads aborted (still reported), terminal fetches sent.
func (p *pull) finish() {
	p.asked = nil // never sent: nothing to end at the sources
	for _, src := range p.sources {
		if src.s != nil && !src.s.Dead() {
			src.s.FinishConsumer(src.KVRequestID)
		}
	}
}

// sourceFailed marks the source of pull p that session s serves under kv
// as down (its session closed with lookups unanswered).
func (p *pull) sourceFailed(s sourceSession, kv, why string) {
	for _, src := range p.sources {
		if src.s == s && src.KVRequestID == kv && src.down == "" {
			src.down = why
		}
	}
}

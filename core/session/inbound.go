package session

import (
	"fmt"
	"time"

	"github.com/peerkv/peerkv/core/protocol"
)

// Answer is the host's verdict on one key of an inbound lookup.
type Answer int8

const (
	AnswerMiss  Answer = iota // not held
	AnswerHit                 // held and pinned
	AnswerLater               // being promoted: ask again next pass
)

// InboundLookup is one lookup from the peer, answered by the host through
// the owner. Exactly one lookup_resp goes out per lookup, keys in wire order,
// unless the consumer ended the request first (terminal fetch).
type InboundLookup struct {
	ID          int64
	ReqID       string // synthetic host request id
	KVRequestID string
	Round       uint64

	state inboundState
	// evaluated: the host started a context for it, which it releases on a
	// Finish item, or on the answer to a checkout that outlived the lookup.
	evaluated  bool
	lateAnswer bool // ended while checked out: the host's answer ends it

	s        *Session // stamped by the report that hands it to the owner
	keys     [][]byte // never changes once filed: holdings.go counts its share once
	resolved map[string]bool
	// pending are the keys not yet offered to the host in this pass, offered
	// at most MaxEvaluateKeys at a time; retry those it answered "later",
	// offered again in the next pass.
	pending  [][]byte
	retry    [][]byte
	nextPass bool // pending holds the retried keys
	arrived  time.Time
	deadline time.Time
}

// inboundState is where an inbound lookup stands; only the session changes
// it, and the owner hands it out through CheckOut.
type inboundState int8

const (
	inboundWaiting    inboundState = iota // keys wait for the host's (next) evaluation
	inboundCheckedOut                     // handed to the host; its answer is owed
	inboundDone                           // answered or dropped; nothing more happens
)

// Session returns the session the lookup came from.
func (l *InboundLookup) Session() *Session { return l.s }

// CheckOut hands the lookup to the host for evaluation; first says the host
// must start a context for it.
func (l *InboundLookup) CheckOut() (first bool) {
	first = !l.evaluated
	l.evaluated = true
	l.state = inboundCheckedOut
	return first
}

// Evaluated reports whether the host has evaluated it at least once.
func (l *InboundLookup) Evaluated() bool { return l.evaluated }

// CheckedOut reports whether the host holds it and owes an answer.
func (l *InboundLookup) CheckedOut() bool { return l.state == inboundCheckedOut }

// OwesFinish reports whether the host needs a Finish item once the lookup
// is over: it started a context and no answer of its will end it.
func (l *InboundLookup) OwesFinish() bool {
	return l.evaluated && l.state != inboundCheckedOut && !l.lateAnswer
}

// MaxEvaluateKeys bounds the keys of one lookup the host evaluates, and
// answers, in one host call, so that the calls stay short (under the owner's
// lock) whatever a peer asks: a larger lookup is offered in parts.
const MaxEvaluateKeys = 256

// Pending returns the keys the host must (re)evaluate next, in first-seen
// order: at most MaxEvaluateKeys of them.
func (l *InboundLookup) Pending() [][]byte { return l.pending[:min(len(l.pending), MaxEvaluateKeys)] }

// NextPass reports whether the keys l waits on are those the host answered
// "later", to be offered in its next pass; false while parts of a large
// lookup wait to be offered in this one.
func (l *InboundLookup) NextPass() bool { return l.nextPass }

// PreparedLookup is a lookup with the work that grows with its keys done
// (Prepare), so that handling it does not.
type PreparedLookup struct {
	*protocol.Lookup
	prepared bool
	pending  [][]byte        // its distinct keys, in first-seen order
	resolved map[string]bool // sized for them
	// refusal is the all-miss answer, encoded, to a lookup of more keys
	// than a peer may make us hold (max_keys_per_peer): it is never filed.
	refusal protocol.Message
}

// Prepare does the work on m that grows with its size, so the owner can do
// it without its lock and Handle only files the result; maxKeys is
// max_keys_per_peer. It returns what to pass to Handle: m itself for
// messages with nothing to prepare.
func Prepare(m protocol.Message, maxKeys int) protocol.Message {
	l, ok := m.(*protocol.Lookup)
	if !ok {
		return m
	}
	if max(1, len(l.Keys)) > maxKeys { // over the cap whatever the peer holds (producer.overCap)
		answer := &protocol.LookupResp{KVRequestID: l.KVRequestID, Keys: l.Keys, Hits: make([]bool, len(l.Keys))}
		frame, err := protocol.Encode(answer)
		if err != nil {
			return m // encoded when sent, and the error met there
		}
		return &PreparedLookup{Lookup: l, refusal: &protocol.Encoded{Message: answer, Frame: frame}}
	}
	return prepareLookup(l)
}

func prepareLookup(l *protocol.Lookup) *PreparedLookup {
	p := &PreparedLookup{Lookup: l, prepared: true}
	seen := make(map[string]struct{}, len(l.Keys))
	for _, k := range l.Keys {
		if _, dup := seen[string(k)]; !dup {
			seen[string(k)] = struct{}{}
			p.pending = append(p.pending, k)
		}
	}
	p.resolved = make(map[string]bool, len(p.pending))
	return p
}

func (p *producer) onLookup(m *PreparedLookup) error {
	if why := p.overCap(m.KVRequestID, len(m.Keys)); why != "" {
		// Answer at once, all misses, without involving the host.
		p.env.Logf("WARNING", "peer %s: lookup kv_request_id=%s answered as misses: %s", p.peerID, m.KVRequestID, why)
		switch {
		case m.refusal != nil:
			p.send(m.refusal)
		case len(m.Keys) > MaxEvaluateKeys:
			p.send(&DeferredAnswer{kv: m.KVRequestID, keys: m.Keys}) // all misses, encoded off the owner's lock
		default:
			p.send(&protocol.LookupResp{KVRequestID: m.KVRequestID, Keys: m.Keys, Hits: make([]bool, len(m.Keys))})
		}
		return nil
	}
	if !m.prepared {
		m = prepareLookup(m.Lookup)
	}
	id := p.env.NextLookupID()
	l := &InboundLookup{
		ID:          id,
		ReqID:       fmt.Sprintf("p2p:%s:%s:lu%d", p.peerID, m.KVRequestID, id),
		KVRequestID: m.KVRequestID,
		Round:       m.RoundSeq,
		keys:        m.Keys,
		resolved:    m.resolved,
		pending:     m.pending,
	}
	l.arrived = p.env.Now()
	l.deadline = l.arrived.Add(p.env.Cfg.InboundLookupTimeout)
	p.request(m.KVRequestID).addLookup(l)
	p.report(Report{Kind: InboundReady, Lookup: l})
	return nil
}

// AnswerLookup applies the host's answers for l.Pending(): hits were pinned
// as host job pinJob at rows pinRows (one per hit, in key order). It reports
// whether the lookup is finished (its context may be released now).
func (s *Session) AnswerLookup(l *InboundLookup, answers []Answer, pinJob int64, pinRows []uint64) (bool, error) {
	return s.producer.answer(l, answers, pinJob, pinRows)
}

func (p *producer) answer(l *InboundLookup, answers []Answer, pinJob int64, pinRows []uint64) (bool, error) {
	if l.state == inboundDone || p.ended() {
		// The consumer ended the request, the peer left, or the host took too
		// long: release the pins at once.
		if pinJob >= 0 && len(pinRows) > 0 {
			p.report(Report{Kind: StoreDone, JobID: pinJob})
		}
		return true, nil
	}
	offered := l.Pending()
	if len(answers) != len(offered) {
		return false, fmt.Errorf("got %d answers for %d keys", len(answers), len(offered))
	}
	var hits [][]byte
	var later [][]byte
	for i, a := range answers {
		switch a {
		case AnswerHit:
			hits = append(hits, offered[i])
		case AnswerLater:
			later = append(later, offered[i])
		}
	}
	if len(hits) != len(pinRows) {
		return false, fmt.Errorf("%d hits but %d pinned rows", len(hits), len(pinRows))
	}
	if len(hits) > 0 && pinJob < 0 {
		return false, fmt.Errorf("%d hits but no pin job", len(hits))
	}
	l.state = inboundWaiting
	for i, a := range answers {
		if a != AnswerLater {
			l.resolved[string(offered[i])] = a == AnswerHit
		}
	}
	if len(hits) > 0 {
		p.addStored(l.KVRequestID, hits, pinRows, pinJob, l.Round, true)
	}
	l.pending = l.pending[len(offered):]
	l.retry = append(l.retry, later...)
	l.nextPass = false
	if len(l.pending) == 0 {
		l.pending, l.retry, l.nextPass = l.retry, nil, true
	}
	if len(l.pending) > 0 && p.env.Now().Before(l.deadline) {
		return false, nil
	}
	p.respond(l)
	return true, nil
}

// respond sends the lookup's single answer; keys still pending count as misses.
func (p *producer) respond(l *InboundLookup) {
	answer := &DeferredAnswer{kv: l.KVRequestID, keys: l.keys, resolved: l.resolved}
	if len(l.keys) <= MaxEvaluateKeys {
		p.send(answer.Build())
	} else {
		p.send(answer) // built and encoded by the owner off its lock
	}
	if served := p.env.LookupServed; served != nil {
		served(p.env.Now().Sub(l.arrived))
	}
	l.state = inboundDone
	l.pending, l.retry = nil, nil
	if req := p.requests[l.KVRequestID]; req != nil {
		req.dropLookup(l.ID)
	}
	p.prune(l.KVRequestID)
}

// dropLookups ends every lookup of kvID without answering (the consumer
// finished the request).
func (p *producer) dropLookups(kvID string) {
	req := p.requests[kvID]
	if req == nil {
		return
	}
	for id, l := range req.lookups {
		l.lateAnswer = l.lateAnswer || l.CheckedOut() // the host's answer ends it: no Finish item
		l.state = inboundDone
		req.dropLookup(id)
		p.report(Report{Kind: InboundFinished, Lookup: l})
	}
}

// tickLookups answers lookups whose keys stayed pending past the deadline.
// One the host checked out and never answered is given up one more
// deadline later: the host's late answer then finds it gone and releases
// its pins.
func (p *producer) tickLookups(now time.Time) {
	grace := p.env.Cfg.InboundLookupTimeout
	for _, req := range p.requests {
		for _, l := range req.lookups {
			if now.Before(l.deadline) || (l.CheckedOut() && now.Before(l.deadline.Add(grace))) {
				continue
			}
			if l.CheckedOut() {
				p.env.Logf("WARNING", "peer %s: the host did not answer lookup kv_request_id=%s within %v; answering it as misses",
					p.peerID, l.KVRequestID, 2*grace)
				l.lateAnswer = true // its late answer finds it gone: no Finish item is owed
				p.respond(l)
				p.report(Report{Kind: InboundFinished, Lookup: l})
				continue
			}
			p.env.Logf("WARNING", "peer %s: lookup kv_request_id=%s still had %d keys pending after %v; answering them as misses",
				p.peerID, l.KVRequestID, len(l.pending)+len(l.retry), p.env.Cfg.InboundLookupTimeout)
			p.respond(l)
			p.report(Report{Kind: InboundFinished, Lookup: l})
		}
	}
}

// DeferredAnswer is the lookup_resp to a lookup of more than
// MaxEvaluateKeys keys. Its hits are gathered, and the frame encoded, when
// the owner calls Build, which it does without its lock (the work grows
// with the keys): what it reads no longer changes once the lookup was
// answered. The owner sends it, and what follows it to the same peer, in
// order.
type DeferredAnswer struct {
	kv       string
	keys     [][]byte
	resolved map[string]bool
}

func (*DeferredAnswer) MsgType() protocol.Type { return protocol.TypeLookupResp }

// Build returns the lookup_resp; keys never resolved count as misses.
func (a *DeferredAnswer) Build() *protocol.LookupResp {
	hits := make([]bool, len(a.keys))
	for i, k := range a.keys {
		hits[i] = a.resolved[string(k)]
	}
	return &protocol.LookupResp{KVRequestID: a.kv, Keys: a.keys, Hits: hits}
}

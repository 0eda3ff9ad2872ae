package session

// What the peer makes this producer hold, kept as running totals so that
// overCap and Holds cost the same however much the peer holds. The methods
// in this file are the only writers of a request's rounds and lookups and
// of a round's wanted and available keys; each moves the totals by what it
// changed, so no caller has an update to remember.

// holdings are the totals over every kv id of one peer.
type holdings struct {
	entries int        // rounds (tombstones included) and inbound lookups
	keys    int        // the entries' shares of max_keys_per_peer
	wanted  int        // fetched keys awaiting supply
	all     *KeyBudget // every peer's keys together (Env.Keys); nil if the owner keeps none
}

// KeyBudget is what every session of one owner holds together: keys, as
// each counts them toward max_keys_per_peer, and how many peers hold any.
// Sessions bound it (overCap): all peers together may make us hold
// max_keys_per_peer keys, and past that a peer may add keys only within its
// share of them (the bound over the peers holding keys). Guarded by the owner's lock, as the sessions are.
type KeyBudget struct {
	Keys    int
	Holders int
}

// count moves the budget by a peer's change of keys from before to after.
func (b *KeyBudget) count(before, after int) {
	if b == nil {
		return
	}
	b.Keys += after - before
	switch {
	case before == 0 && after > 0:
		b.Holders++
	case before > 0 && after == 0:
		b.Holders--
	}
}

// share is what one entry counts toward the totals.
type share struct {
	keys   int
	wanted int
}

func (h *holdings) add(s share) {
	h.entries++
	h.all.count(h.keys, h.keys+s.keys)
	h.keys += s.keys
	h.wanted += s.wanted
}

func (h *holdings) remove(s share) {
	h.entries--
	h.all.count(h.keys, h.keys-s.keys)
	h.keys -= s.keys
	h.wanted -= s.wanted
}

// move replaces an entry's share from by to. A round no longer filed has no
// holdings (nil) and counts for nothing, as it did when overCap walked them.
func (h *holdings) move(from, to share) {
	if h == nil {
		return
	}
	h.all.count(h.keys, h.keys+to.keys-from.keys)
	h.keys += to.keys - from.keys
	h.wanted += to.wanted - from.wanted
}

// share of a round: at least one key, so neither empty rounds nor
// tombstones of made-up rounds grow without bound.
func (r *round) share() share {
	return share{keys: max(1, len(r.wanted)+len(r.available)), wanted: len(r.wanted)}
}

// share of a lookup: at least one key, so empty lookups are bounded too.
// Its keys never change once it is filed.
func (l *InboundLookup) share() share { return share{keys: max(1, len(l.keys))} }

// producerRequest is what the peer holds under one kv id.
type producerRequest struct {
	held    *holdings // the peer's totals, shared by its requests
	rounds  map[uint64]*round
	lookups map[int64]*InboundLookup
}

func newProducerRequest(held *holdings) *producerRequest {
	return &producerRequest{held: held, rounds: map[uint64]*round{}, lookups: map[int64]*InboundLookup{}}
}

// round returns round seq, filing a new open one if there is none.
func (req *producerRequest) round(seq uint64) *round {
	r := req.rounds[seq]
	if r == nil {
		r = newRound()
		r.held = req.held
		req.rounds[seq] = r
		req.held.add(r.share())
	}
	return r
}

// dropRound forgets round seq; whoever still points at it changes nothing
// the caps see.
func (req *producerRequest) dropRound(seq uint64) {
	r := req.rounds[seq]
	if r == nil {
		return
	}
	req.held.remove(r.share())
	r.held = nil
	delete(req.rounds, seq)
}

func (req *producerRequest) addLookup(l *InboundLookup) {
	req.dropLookup(l.ID) // ids are unique; never count one twice
	req.lookups[l.ID] = l
	req.held.add(l.share())
}

func (req *producerRequest) dropLookup(id int64) {
	if l := req.lookups[id]; l != nil {
		req.held.remove(l.share())
		delete(req.lookups, id)
	}
}

// settle moves the totals from the share the round had before an edit to
// the one it has now. Edits defer it with the old share:
// defer r.settle(r.share()).
func (r *round) settle(before share) { r.held.move(before, r.share()) }

// want files demand: key awaits supply, to be written to consumer row dst.
func (r *round) want(key string, dst uint64) {
	defer r.settle(r.share())
	r.wanted[key] = dst
}

// takeWanted removes and returns the demand for key, if any.
func (r *round) takeWanted(key string) (dst uint64, ok bool) {
	defer r.settle(r.share())
	dst, ok = r.wanted[key]
	delete(r.wanted, key)
	return dst, ok
}

// offer files supply no fetch asked for yet.
func (r *round) offer(key string, sup supply) {
	defer r.settle(r.share())
	r.available[key] = sup
}

// takeSupply removes and returns the supply for key, if any.
func (r *round) takeSupply(key string) (sup supply, ok bool) {
	defer r.settle(r.share())
	sup, ok = r.available[key]
	delete(r.available, key)
	return sup, ok
}

// dropSupplyOf drops the supply job pinned.
func (r *round) dropSupplyOf(job int64) {
	defer r.settle(r.share())
	for k, sup := range r.available {
		if sup.job == job {
			delete(r.available, k)
		}
	}
}

// dropSupply drops every supply.
func (r *round) dropSupply() {
	defer r.settle(r.share())
	clear(r.available)
}

// dropKeys drops demand and supply: the round ended.
func (r *round) dropKeys() {
	defer r.settle(r.share())
	clear(r.available)
	clear(r.wanted)
}

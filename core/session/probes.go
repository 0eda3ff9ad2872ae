package session

import "unsafe"

// probeTable is what one request's peer answered for each key of the
// current round. A key is inserted once (the map's only allocation per key)
// and its state changes in place, so flushing, answering and timing out a
// step's thousands of keys allocate nothing.
type probeTable struct {
	index  map[string]int32 // key -> its state in states
	states []probe
}

// reserve makes room for n more keys: a host call registers a whole
// request's keys at once.
func (t *probeTable) reserve(n int) {
	if len(t.index) == 0 && n > 0 {
		t.index = make(map[string]int32, n)
		t.states = make([]probe, 0, n)
	}
}

func (t *probeTable) get(key []byte) (probe, bool) {
	i, ok := t.index[string(key)]
	if !ok {
		return 0, false
	}
	return t.states[i], true
}

// add registers key, which get did not find, as unsent. The table keeps
// key's bytes as its map key without a copy (see RegisterLookup).
func (t *probeTable) add(key []byte) {
	if t.index == nil {
		t.index = make(map[string]int32)
	}
	t.index[unsafe.String(unsafe.SliceData(key), len(key))] = int32(len(t.states))
	t.states = append(t.states, probeUnsent)
}

// markNewest moves those of the n keys added last that are still from to
// to: an answer may have come for one before it was sent.
func (t *probeTable) markNewest(n int, from, to probe) {
	for i := len(t.states) - n; i < len(t.states); i++ {
		if t.states[i] == from {
			t.states[i] = to
		}
	}
}

// move sets key's state to to if it is from; it reports whether it did.
func (t *probeTable) move(key []byte, from, to probe) bool {
	i, ok := t.index[string(key)]
	if !ok || t.states[i] != from {
		return false
	}
	t.states[i] = to
	return true
}

func (t *probeTable) set(key []byte, p probe) {
	if i, ok := t.index[string(key)]; ok {
		t.states[i] = p
	}
}

func (t *probeTable) len() int { return len(t.states) }

// any reports whether some key is in one of the states.
func (t *probeTable) any(ps ...probe) bool {
	for _, s := range t.states {
		for _, p := range ps {
			if s == p {
				return true
			}
		}
	}
	return false
}

func (t *probeTable) clear() {
	clear(t.index)
	t.states = t.states[:0]
}

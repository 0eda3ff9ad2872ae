package tier

// sourceSet is a set of a pull's sources by index (params.MaxSources <= 64).
type sourceSet uint64

func (s sourceSet) with(i int) sourceSet          { return s | 1<<i }
func (s sourceSet) has(i int) bool                { return s&(1<<i) != 0 }
func (s sourceSet) without(o sourceSet) sourceSet { return s &^ o }
func (s sourceSet) empty() bool                   { return s == 0 }

// spreadChunk is how many rows one source takes in a row before the next
// source holding the same keys takes the following ones. A load shorter
// than that stays with the orchestrator's first choice among the keys'
// holders; a long one is dealt out in chunks across every holder, so the
// pull uses several peers' bandwidth (TCP is per-connection bound).
const spreadChunk = 16

// place gives each key to one of its candidate sources: the candidate that
// has taken the fewest whole chunks in this load so far (rows counts each
// source's rows, and is updated), the orchestrator's earlier choice on a
// tie. A key without candidates gets -1.
func place(cands []sourceSet, rows []int) []int {
	out := make([]int, len(cands))
	for k, set := range cands {
		best := -1
		for i := range rows {
			if set.has(i) && (best < 0 || rows[i]/spreadChunk < rows[best]/spreadChunk) {
				best = i
			}
		}
		out[k] = best
		if best >= 0 {
			rows[best]++
		}
	}
	return out
}

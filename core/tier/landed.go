package tier

import (
	"sync/atomic"

	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/data/rowsum"
)

// Landed sums: the rows of a verified load that arrive through the row
// guard (TCP, memdata) are summed as the guard copies each in, a piece at
// a time while the piece is in the cache, so the check after transfer_done
// compares those sums instead of reading every row again (docs/security.md
// G18). Each row has a state word and a sum:
//
//	bit 0      wanted: the row is owed to a load that keeps landed sums
//	bit 1      busy: a guarded write is under way
//	bit 2      overlapped: a write began while another was under way
//	bit 3      valid: sum is the row's bytes as the last write left them
//	bits 4-63  generation: bumped by every write that begins and by reset
//
// A write marks the row busy (clearing valid) before it copies, and sets
// valid only if the word is still the one it left (compare-and-swap): no
// other write began and the row was not reset meanwhile. A write that
// begins while another is under way marks the row overlapped, which only
// reset clears: such a row has no sum and the check reads it. The check
// reads the sums under the guard's write lock, when no guarded write is
// under way, so a valid sum is the sum of what the row holds then, unless
// something wrote it around the guard (landedUnguarded).
const (
	landedWanted     = uint64(1) << 0
	landedBusy       = uint64(1) << 1
	landedOverlapped = uint64(1) << 2
	landedValid      = uint64(1) << 3
	landedGen        = uint64(1) << 4
)

// landedRow is one row's state word and sum.
type landedRow struct {
	state atomic.Uint64
	sum   atomic.Uint64
}

// landedSums holds one landedRow per region row.
type landedSums []landedRow

// reset starts a row afresh: no sum, wanted or not. Guard's write lock held
// (no write under way).
func (l landedSums) reset(row uint64, wanted bool) {
	if row >= uint64(len(l)) {
		return
	}
	w := (l[row].state.Load() &^ (landedGen - 1)) + landedGen
	if wanted {
		w |= landedWanted
	}
	l[row].state.Store(w)
}

// write copies src into dst, row's bytes, recording the sum of dst as the
// copy left it when the row is wanted. Guard's read lock held.
func (l landedSums) write(row uint64, dst, src []byte) {
	begun := l.begin(row)
	if begun == 0 || len(dst) != len(src) {
		copy(dst, src)
		return
	}
	l.settle(row, begun, rowsum.CopySummed(dst, src))
}

// begin marks a write into row as under way and returns the word it left,
// or 0 when the write records no sum: the row is not wanted, or another
// write is under way (then the row is marked overlapped).
func (l landedSums) begin(row uint64) uint64 {
	if row >= uint64(len(l)) {
		return 0
	}
	for {
		old := l[row].state.Load()
		switch {
		case old&landedWanted == 0:
			return 0
		case old&landedBusy != 0:
			if l[row].state.CompareAndSwap(old, old&^landedValid|landedOverlapped) {
				return 0
			}
		default:
			begun := (old&^(landedGen-1) + landedGen) | old&landedOverlapped | landedWanted | landedBusy
			if l[row].state.CompareAndSwap(old, begun) {
				return begun
			}
		}
	}
}

// settle ends the write that began at begun, recording sum as the row's
// unless another write began since (a reset cannot: it waits for every
// write under way). A row that overlapped stays without a sum until reset.
func (l landedSums) settle(row, begun, sum uint64) {
	if begun&landedOverlapped == 0 {
		l[row].sum.Store(sum) // only the write holding busy stores; others see busy
		if l[row].state.CompareAndSwap(begun, begun&^landedBusy|landedValid) {
			return
		}
	}
	for { // overlapped: no sum; end this write
		old := l[row].state.Load()
		if l[row].state.CompareAndSwap(old, old&^landedBusy) {
			return
		}
	}
}

// landed is row's sum, if one is current. Guard's write lock held.
func (l landedSums) landed(row uint64) (uint64, bool) {
	if row >= uint64(len(l)) {
		return 0, false
	}
	w := l[row].state.Load()
	if w&(landedWanted|landedBusy|landedOverlapped|landedValid) != landedWanted|landedValid {
		return 0, false
	}
	return l[row].sum.Load(), true
}

// landedUnguarded reports whether anything may have written into our
// region around the row guard: a same-host grant a peer claimed, NIXL, a
// path that cannot say (data.Unguarded). Landed sums then prove nothing
// and the check reads every row again.
func landedUnguarded(dt data.Transport) bool {
	u, ok := dt.(data.Unguarded)
	return !ok || u.WritesUnguarded()
}

package tier

import "sync"

// rowGuard is the data paths' write guard (data.WriteGuard, data.OwedRows):
// a peer may write only rows of a load it is serving right now. The pull
// book owns it and is its only writer (expect, revokeAll); the data paths
// only read it, from their own goroutines. Copies hold the read lock, and
// releasing a load's rows (expect off) takes the write lock, so no row
// lands after the load ended. Rows given to a verified load are summed as
// they are copied in (landed.go).
type rowGuard struct {
	mu       sync.RWMutex
	expected map[uint64]string // consumer row -> peer allowed to write it
	owed     map[string]int    // peer -> how many rows of expected it may write
	landed   landedSums        // per region row: its sum as guarded writes left it
}

// newRowGuard guards a region of rows rows; verified says whether loads
// may be verified (then their rows' sums are kept as they land).
func newRowGuard(rows uint64, verified bool) *rowGuard {
	g := &rowGuard{expected: map[uint64]string{}, owed: map[string]int{}}
	if verified {
		g.landed = make(landedSums, rows)
	}
	return g
}

func (g *rowGuard) MayWrite(peerID string, row uint64) bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.expected[row] == peerID
}

// RowsOwed implements data.OwedRows: the data path refuses a transfer
// naming more rows before it allocates anything for them.
func (g *rowGuard) RowsOwed(peerID string) int {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return g.owed[peerID]
}

func (g *rowGuard) WriteRow(peerID string, row uint64, dst, src []byte) bool {
	g.mu.RLock()
	defer g.mu.RUnlock()
	if g.expected[row] != peerID {
		return false
	}
	g.landed.write(row, dst, src)
	return true
}

// expect gives rows to peerID (on) or takes back those of them it holds
// (off). A row given to another peer moves: the one it held it owes one
// less. A row given starts without a landed sum (wanted, when the guard
// keeps them); one taken back keeps none.
func (g *rowGuard) expect(peerID string, rows []uint64, on bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, r := range rows {
		prev, had := g.expected[r]
		switch {
		case on && !(had && prev == peerID):
			if had {
				g.unowe(prev)
			}
			g.expected[r] = peerID
			g.owed[peerID]++
			g.landed.reset(r, true)
		case on:
			g.landed.reset(r, true)
		case !on && had && prev == peerID:
			delete(g.expected, r)
			g.unowe(peerID)
			g.landed.reset(r, false)
		}
	}
}

// landedSums returns, once every copy under way is over, the landed sum of
// each of rows (parallel), and whether it has one: rows written only by
// guarded writes since they were given, the last of them alone.
func (g *rowGuard) landedSums(rows []uint64) ([]uint64, []bool) {
	sums, have := make([]uint64, len(rows)), make([]bool, len(rows))
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, r := range rows {
		sums[i], have[i] = g.landed.landed(r)
	}
	return sums, have
}

// unowe takes one row off what peerID may write; mu held. A peer owed
// nothing leaves no entry.
func (g *rowGuard) unowe(peerID string) {
	if g.owed[peerID]--; g.owed[peerID] <= 0 {
		delete(g.owed, peerID)
	}
}

// revokeAll takes every row back: no peer may write our rows any more.
func (g *rowGuard) revokeAll() {
	g.mu.Lock()
	defer g.mu.Unlock()
	clear(g.expected)
	clear(g.owed)
}

// rowsExpected is how many rows some peer may write now.
func (g *rowGuard) rowsExpected() int {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return len(g.expected)
}

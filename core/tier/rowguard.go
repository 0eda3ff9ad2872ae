package tier

import "sync"

// rowGuard is the data paths' write guard (data.WriteGuard, data.OwedRows):
// a peer may write only rows of a load it is serving right now. The pull
// book owns it and is its only writer (expect, revokeAll); the data paths
// only read it, from their own goroutines. Copies hold the read lock, and
// releasing a load's rows (expect off) takes the write lock, so no row
// lands after the load ended.
type rowGuard struct {
	mu       sync.RWMutex
	expected map[uint64]string // consumer row -> peer allowed to write it
	owed     map[string]int    // peer -> how many rows of expected it may write
}

func newRowGuard() *rowGuard {
	return &rowGuard{expected: map[uint64]string{}, owed: map[string]int{}}
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
	copy(dst, src)
	return true
}

// expect gives rows to peerID (on) or takes back those of them it holds
// (off). A row given to another peer moves: the one it held it owes one
// less.
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
		case !on && had && prev == peerID:
			delete(g.expected, r)
			g.unowe(peerID)
		}
	}
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

// barrier returns once every copy under way when it was called is over:
// writers hold the read lock while they copy, so taking the write lock
// once orders what follows after them.
func (g *rowGuard) barrier() {
	g.mu.Lock()
	g.mu.Unlock() //lint:ignore SA2001 a barrier: the copies made so far are over
}

// rowsExpected is how many rows some peer may write now.
func (g *rowGuard) rowsExpected() int {
	g.mu.RLock()
	defer g.mu.RUnlock()
	return len(g.expected)
}

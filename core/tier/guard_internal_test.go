package tier

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/peerkv/peerkv/core/data"
)

// The guard tells the data path how many rows each peer's loads expect, so
// it can refuse a transfer naming more before allocating for it.
func TestGuardCountsTheRowsEachPeerIsOwed(t *testing.T) {
	tr := &Tier{expected: map[uint64]string{}, owed: map[string]int{}}
	var g data.OwedRows = rowGuard{tr}
	tr.expect("a", []uint64{1, 2, 3}, true)
	tr.expect("a", []uint64{3}, true) // already expected: not counted twice
	assert.Equal(t, 3, g.RowsOwed("a"))
	tr.expect("b", []uint64{3, 4}, true) // row 3 moves to b
	assert.Equal(t, 2, g.RowsOwed("a"))
	assert.Equal(t, 2, g.RowsOwed("b"))
	tr.expect("a", []uint64{1, 2, 3}, false) // 3 is b's: a cannot release it
	assert.Equal(t, 0, g.RowsOwed("a"))
	assert.Equal(t, 2, g.RowsOwed("b"))
	assert.NotContains(t, tr.owed, "a", "a peer owed nothing leaves no entry")
}

package tier

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/data/rowsum"
)

// A row owed to a verified load and written once through the guard has
// the sum of what landed; a row never written, written by a peer it is not
// owed to, or given again to a new load has none (the check reads it).
func TestLandedSumsFollowTheGuardsWrites(t *testing.T) {
	const rowLen = 1 << 20
	region := make([]byte, 4*rowLen)
	row := func(i uint64) []byte { return region[i*rowLen : (i+1)*rowLen] }
	g := newRowGuard(4, true)
	g.expect("p", []uint64{0, 1, 2}, true)
	src := bytes.Repeat([]byte("peerkv"), rowLen/6+1)[:rowLen]

	require.True(t, g.WriteRow("p", 0, row(0), src))
	require.False(t, g.WriteRow("q", 1, row(1), src), "not owed to q")
	sums, have := g.landedSums([]uint64{0, 1, 2, 3})
	assert.Equal(t, []bool{true, false, false, false}, have)
	assert.Equal(t, rowsum.Row(src), sums[0])

	g.expect("p", []uint64{0}, true) // the row given again: a new load
	_, have = g.landedSums([]uint64{0})
	assert.False(t, have[0], "a sum of an earlier load never counts for a new one")

	require.True(t, g.WriteRow("p", 0, row(0), src))
	g.expect("p", []uint64{0}, false)
	_, have = g.landedSums([]uint64{0})
	assert.False(t, have[0], "a row taken back keeps no sum")
}

// A write that begins while another write of the same row is under way
// leaves the row without a sum until it is given anew: neither write's
// sum describes what the row holds.
func TestOverlappingWritesLeaveNoSum(t *testing.T) {
	l := make(landedSums, 1)
	l.reset(0, true)
	first := l.begin(0)
	require.NotZero(t, first)
	assert.Zero(t, l.begin(0), "a second write under way records no sum")
	l.settle(0, first, 42)
	_, ok := l.landed(0)
	assert.False(t, ok)
	again := l.begin(0)
	require.NotZero(t, again)
	l.settle(0, again, 43)
	_, ok = l.landed(0)
	assert.False(t, ok, "an overlapped row stays without a sum until reset")
	l.reset(0, true)
	w := l.begin(0)
	l.settle(0, w, 44)
	sum, ok := l.landed(0)
	assert.True(t, ok)
	assert.Equal(t, uint64(44), sum)
}

// A guard of a tier that does not verify keeps no sums and copies as
// before.
func TestUnverifiedGuardKeepsNoSums(t *testing.T) {
	g := newRowGuard(2, false)
	g.expect("p", []uint64{0}, true)
	dst, src := make([]byte, 8), []byte("12345678")
	require.True(t, g.WriteRow("p", 0, dst, src))
	assert.Equal(t, src, dst)
	_, have := g.landedSums([]uint64{0})
	assert.False(t, have[0])
}

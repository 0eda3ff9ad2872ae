package rowsum

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/peerkv/peerkv/core/data"
)

func region(rows int, rowLen uint64) data.Region {
	r := data.Region{Mem: make([]byte, uint64(rows)*rowLen), RowLen: rowLen}
	for i := range r.Mem {
		r.Mem[i] = byte(i*31 + i>>9)
	}
	return r
}

// Row is XXH3-64 with seed 0: the reference implementation's value for
// the empty input, and for "abc" (both peers must compute the same).
func TestRowIsXXH3(t *testing.T) {
	assert.Equal(t, uint64(0x2d06800538d394c2), Row(nil))
	assert.Equal(t, uint64(0x78af5f94892f3950), Row([]byte("abc")))
}

// A batch large enough to spread over the CPUs gives the sums, in order,
// that one row at a time gives; Mismatch names the first row that differs.
func TestRowsInOrderAndMismatch(t *testing.T) {
	r := region(16, 1<<20) // 16 MiB: the parallel branch
	rows := []uint64{15, 0, 7, 7, 3}
	sums := Rows(r, rows)
	for i, row := range rows {
		assert.Equal(t, Row(r.Row(row)), sums[i])
	}
	assert.Equal(t, -1, Mismatch(r, rows, sums))
	r.Row(3)[1<<19] ^= 1
	assert.Equal(t, 4, Mismatch(r, rows, sums))
}

// CopySummed copies a row and returns the checksum one pass over the
// copy gives, for rows that are and are not a whole number of pieces.
func TestCopySummedCopiesAndSumsLikeRow(t *testing.T) {
	for _, n := range []uint64{0, 1, piece - 1, piece, 3*piece + 17} {
		src, dst := region(1, max(n, 1)).Mem[:n], make([]byte, n)
		assert.Equal(t, Row(src), CopySummed(dst, src), "%d bytes", n)
		assert.Equal(t, src, dst)
	}
}

// What a verified pull adds to a row's copy: BenchmarkRow against
// BenchmarkCopy on the same 2 MiB row (a 16-token block of a mid-size
// model). See docs/benchmarks.md for the figures and the choice of XXH3-64.
func BenchmarkRow(b *testing.B) {
	row := region(1, 2<<20).Mem
	b.SetBytes(int64(len(row)))
	for b.Loop() {
		Row(row)
	}
}

// BenchmarkCopySummed is the consumer's landing of a verified row over a
// guarded path: the copy with each piece summed right after it.
func BenchmarkCopySummed(b *testing.B) {
	src, dst := region(1, 2<<20).Mem, make([]byte, 2<<20)
	b.SetBytes(int64(len(src)))
	for b.Loop() {
		CopySummed(dst, src)
	}
}

func BenchmarkCopy(b *testing.B) {
	src, dst := region(1, 2<<20).Mem, make([]byte, 2<<20)
	b.SetBytes(int64(len(src)))
	for b.Loop() {
		copy(dst, src)
	}
}

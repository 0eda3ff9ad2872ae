package rowsum

import (
	"hash/crc32"
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

// Row is CRC-32C: the reference value of RFC 3720 B.4 for 32 zero bytes.
func TestRowIsCRC32C(t *testing.T) {
	assert.Equal(t, uint32(0x8a9136aa), Row(make([]byte, 32)))
}

// A batch large enough to spread over the CPUs gives the sums, in order,
// that one row at a time gives; Mismatch names the first row that differs.
func TestRowsInOrderAndMismatch(t *testing.T) {
	r := region(16, 1<<20) // 16 MiB: the parallel branch
	rows := []uint64{15, 0, 7, 7, 3}
	sums := Rows(r, rows)
	for i, row := range rows {
		assert.Equal(t, crc32.Checksum(r.Row(row), crc32.MakeTable(crc32.Castagnoli)), sums[i])
	}
	assert.Equal(t, -1, Mismatch(r, rows, sums))
	r.Row(3)[1<<19] ^= 1
	assert.Equal(t, 4, Mismatch(r, rows, sums))
}

// What a verified pull adds to a row's copy: BenchmarkRow against
// BenchmarkCopy on the same 2 MiB row (a 16-token block of a mid-size
// model). See docs/benchmarks.md for the figures and the choice of CRC-32C.
func BenchmarkRow(b *testing.B) {
	row := region(1, 2<<20).Mem
	b.SetBytes(int64(len(row)))
	for b.Loop() {
		Row(row)
	}
}

func BenchmarkCopy(b *testing.B) {
	src, dst := region(1, 2<<20).Mem, make([]byte, 2<<20)
	b.SetBytes(int64(len(src)))
	for b.Loop() {
		copy(dst, src)
	}
}

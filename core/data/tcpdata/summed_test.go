package tcpdata

import (
	"bytes"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/data/rowsum"
)

// A summed write's senders sum each source row right after writev read
// it: the completion carries each row's sum, and a source row changed
// between its send and its sum gets a sum of bytes that did not land, so
// the consumer's check fails the load. A plain write carries no sums.
func TestSummedWritesSumEachRowAfterItsSend(t *testing.T) {
	src := randomRegion(t, 40)
	dst := sentinelRegion(40)
	a := newTransport(t, "a", src, nil)
	b := newTransport(t, "b", dst, func(o *Options) { o.Guard = data.GuardFunc(func(string, uint64) bool { return true }) })
	addPeer(t, a, "b", b)
	srcRows, dstRows := seq(0, 40), make([]uint64, 40)
	for i := range dstRows {
		dstRows[i] = uint64(39 - i)
	}
	const changed = 17
	before := bytes.Clone(src.Row(changed))
	a.SetBetweenReads(func(peerID string, rows []uint64) {
		assert.Equal(t, "b", peerID)
		for _, r := range rows {
			if r == changed {
				src.Row(r)[5] ^= 0x01 // sent already, not yet summed
			}
		}
	})
	id, err := a.WriteSummed("b", srcRows, dstRows)
	require.NoError(t, err)
	c := nextCompletion(t, a, waitLimit)
	require.NoError(t, c.Err)
	assert.Equal(t, id, c.ID)
	require.Len(t, c.Sums, 40)
	for i, r := range srcRows {
		assert.Equal(t, rowsum.Row(src.Row(r)), c.Sums[i], "row %d", r)
	}
	assert.Equal(t, before, dst.Row(39-changed), "the row landed as it was sent")
	assert.NotEqual(t, rowsum.Row(dst.Row(39-changed)), c.Sums[changed], "its sum saw the change: the check fails")

	a.SetBetweenReads(nil)
	_, err = a.Write("b", srcRows[:2], dstRows[:2])
	require.NoError(t, err)
	c = nextCompletion(t, a, waitLimit)
	require.NoError(t, c.Err)
	assert.Nil(t, c.Sums)
}

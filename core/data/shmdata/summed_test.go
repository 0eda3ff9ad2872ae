package shmdata

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/data/rowsum"
)

// A summed write's copy workers sum each source row right after copying
// it: the completion carries each row's sum, and a source row changed
// between its copy and its sum gets a sum of bytes that did not land, so
// the consumer's check fails the load (the tier's TestVerifiedShmPull).
// Both copies: memcpy and the kernel's.
func TestSummedWritesSumEachRowAfterItsCopy(t *testing.T) {
	for _, kernel := range []bool{false, true} {
		t.Run(fmt.Sprintf("kernel copy %v", kernel), func(t *testing.T) {
			const rows, rowLen = 8, 3 << 19 // 1.5 MiB: one row per batch
			cons := startChild(t, consID, rows, rowLen, 0)
			tr, src := producer(t, prodID, rows, rowLen)
			tr.kernelCopyOnly = kernel
			require.NoError(t, tr.AddPeer(consID, offered(cons.ask("offer %s", prodID))))
			from, to := []uint64{0, 1, 2, 3, 4, 5}, []uint64{7, 6, 5, 4, 3, 2}

			landed := make([]byte, rows*rowLen)
			for i := range from {
				copy(landed[to[i]*rowLen:], src.Row(from[i]))
			}
			tr.SetBetweenReads(func(peerID string, rows []uint64) {
				assert.Equal(t, consID, peerID)
				for _, r := range rows {
					if r == 3 {
						src.Row(3)[rowLen/2] ^= 0x80 // after the copy read it, before the sum does
					}
				}
			})
			id, err := tr.WriteSummed(consID, from, to)
			require.NoError(t, err)
			c := takeCompletion(t, tr, id)
			require.NoError(t, c.Err)
			require.Len(t, c.Sums, len(from))
			for i, r := range from {
				if r == 3 {
					assert.NotEqual(t, rowsum.Row(landed[to[i]*rowLen:(to[i]+1)*rowLen]), c.Sums[i], "the sum saw the change, the copy did not")
					continue
				}
				assert.Equal(t, rowsum.Row(src.Row(r)), c.Sums[i], "row %d", r)
			}
			sum := sha256.Sum256(landed)
			assert.Equal(t, hex.EncodeToString(sum[:]), cons.ask("sum"), "the rows landed as they were before the change")

			plain, err := tr.Write(consID, from[:1], to[:1])
			require.NoError(t, err)
			assert.Nil(t, takeCompletion(t, tr, plain).Sums, "a plain write carries no sums")
		})
	}
}

func takeCompletion(t *testing.T, tr *Transport, id uint64) data.Completion {
	t.Helper()
	select {
	case c := <-tr.Completions():
		require.Equal(t, id, c.ID)
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no completion within 10s")
		return data.Completion{}
	}
}

// A consumer's rows can be written around its row guard from the moment a
// peer holds its region's fd, and for good: it says so (data.Unguarded),
// so verified loads are checked by reading every row again.
func TestAClaimedGrantMeansWritesAroundTheGuard(t *testing.T) {
	const rows, rowLen = 4, 8192
	cons, _ := consumerRegion(t, rows, rowLen, nil)
	offer := cons.Offer(prodID)
	assert.False(t, cons.WritesUnguarded(), "an offer alone lets no one write")
	self, err := os.Executable()
	require.NoError(t, err)
	out, err := runProducerCmd(t, exec.Command(self, "-test.run=^$"), rows, rowLen, offer)
	require.NoError(t, err, "the producer said: %s", out)
	assert.True(t, cons.WritesUnguarded())
}

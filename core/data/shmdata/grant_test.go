package shmdata

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/peerkv/peerkv/core/data"
)

// A same-uid consumer once made a producer map a 16 TiB sparse file: the
// grant named more rows than its session declared and nothing compared
// the two.
func TestAGrantOfMoreRowsThanTheSessionDeclaredIsRefused(t *testing.T) {
	const rowLen, declared = 4096, 64
	const granted = 1 << 28 // 1 TiB of rows; a sparse memfd costs nothing
	cons := startChild(t, consID, granted, rowLen, 0)
	tr, _ := producer(t, prodID, declared, rowLen)

	err := tr.AddPeer(consID, offeredRows(cons.ask("offer %s", prodID), declared))
	require.Error(t, err)
	assert.Contains(t, err.Error(), fmt.Sprintf("granted %d rows, more than the %d its session declared", granted, declared))
	_, err = tr.Write(consID, []uint64{0}, []uint64{granted - 1})
	assert.ErrorIs(t, err, data.ErrUnknownPeer, "nothing was registered")

	require.NoError(t, tr.AddPeer(consID, offeredRows(cons.ask("offer %s", prodID), granted)),
		"the same grant within the session's declaration is taken")
}

// The consumer says how large its file is; the producer's fstat of the
// fd it got must agree, and the file must hold every granted row.
func TestAGrantedFileOfAnotherSizeThanClaimedIsRefused(t *testing.T) {
	const rows, rowLen = 8, 4096
	for name, c := range map[string]struct {
		size int
		want string
	}{
		"larger":  {rows*rowLen + 4096, fmt.Sprintf("holds %d bytes, not the %d", rows*rowLen+4096, rows*rowLen)},
		"smaller": {rows * rowLen / 2, fmt.Sprintf("holds %d bytes", rows*rowLen/2)},
	} {
		t.Run(name, func(t *testing.T) {
			cons := startChild(t, consID, rows, rowLen, 0)
			tr, _ := producer(t, prodID, rows, rowLen)
			require.Equal(t, "ok", cons.ask("claim %d %d", rows, rows*rowLen))
			require.Equal(t, "ok", cons.ask("resize %d", c.size))
			err := tr.AddPeer(consID, offered(cons.ask("offer %s", prodID)))
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
			_, err = tr.Write(consID, []uint64{0}, []uint64{0})
			assert.ErrorIs(t, err, data.ErrUnknownPeer, "nothing was registered")
		})
	}
}

// A token grants the fd once: a captured offer is worth nothing after the
// claim it was made for, within its TTL too.
func TestAGrantTokenIsSingleUse(t *testing.T) {
	cons := startChild(t, consID, 8, 4096, 0)
	tr, _ := producer(t, prodID, 8, 4096)
	offer := cons.ask("offer %s", prodID)
	require.NoError(t, tr.AddPeer(consID, offered(offer)))

	replayer, _ := producer(t, prodID, 8, 4096) // the right id too
	err := replayer.AddPeer(consID, offered(offer))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "already used")
	assert.ErrorContains(t, tr.AddPeer(consID, offered(offer)), "already used", "nor by the one it was issued to")
	assert.Contains(t, cons.ask("logs"), "its token was already used")

	id, err := tr.Write(consID, []uint64{1}, []uint64{2})
	require.NoError(t, err, "the first claim stands")
	require.NoError(t, completion(t, tr, id))
	require.NoError(t, replayer.AddPeer(consID, offered(cons.ask("offer %s", prodID))), "a fresh offer grants again")
}

// The fd a claimant gets serves writing rows and nothing else: it cannot
// read the consumer's rows or map its file, and a sealable region cannot
// be shrunk or grown through it.
func TestTheGrantedFdCannotReadMapOrResizeTheRegion(t *testing.T) {
	const rows, rowLen = 8, 4096
	var mu sync.Mutex
	var logs []string
	cons, _, _ := consumerRegionFd(t, rows, rowLen, unix.MFD_ALLOW_SEALING, func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		logs = append(logs, fmt.Sprintf(format, args...))
	})
	self, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = childEnviron(rawClaimEnv + "=" + prodID + " " + cons.Offer(prodID))
	out, err := runBounded(t, cmd)
	require.NoError(t, err, "the claimant said: %s", out)
	require.True(t, strings.HasPrefix(out, fmt.Sprintf("fds 1 reply %d ", statusGranted)), "granted: %s", out)
	ebadf, eacces, eperm := unix.EBADF.Error(), unix.EACCES.Error(), unix.EPERM.Error()
	assert.Contains(t, out, " read="+ebadf+" ", "write-only: no reading the consumer's rows")
	assert.Contains(t, out, " map="+eacces+" ", "no mapping of its file")
	assert.Contains(t, out, " shrink="+eperm+" ", "a sealed region cannot be shrunk under its host")
	assert.Contains(t, out, " grow="+eperm+"\n", "nor grown")
}

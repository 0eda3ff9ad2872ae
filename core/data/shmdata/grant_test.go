package shmdata

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"unsafe"

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

// A claimant gets a read-write fd (the producer maps the granted rows, and
// a mapping needs read access), but a sealable region cannot be shrunk or
// grown through it; and our producer maps the pages of the granted rows
// alone, not the file around them.
func TestAGrantCannotResizeASealedRegionAndMapsOnlyTheGrantedRows(t *testing.T) {
	const rows, rowLen = 8, 4096
	t.Run("a sealed region keeps its size", func(t *testing.T) {
		cons, _, _ := consumerRegionFd(t, rows, rowLen, unix.MFD_ALLOW_SEALING, nil)
		self, err := os.Executable()
		require.NoError(t, err)
		cmd := exec.Command(self, "-test.run=^$")
		cmd.Env = childEnviron(rawClaimEnv + "=" + prodID + " " + cons.Offer(prodID))
		out, err := runBounded(t, cmd)
		require.NoError(t, err, "the claimant said: %s", out)
		require.True(t, strings.HasPrefix(out, fmt.Sprintf("fds 1 reply %d ", statusGranted)), "granted: %s", out)
		eperm := unix.EPERM.Error()
		assert.Contains(t, out, " shrink="+eperm+" ", "a sealed region cannot be shrunk under its host")
		assert.Contains(t, out, " grow="+eperm+"\n", "nor grown")
	})
	t.Run("the producer maps the granted rows' pages alone", func(t *testing.T) {
		page := unix.Getpagesize()
		skip := 3*page + 96 // the region starts mid-page, three pages into its file
		cons := startChild(t, consID, rows, rowLen, skip)
		tr, _ := producer(t, prodID, rows, rowLen)
		require.NoError(t, tr.AddPeer(consID, offered(cons.ask("offer %s", prodID))))
		tr.mu.Lock()
		mapped := tr.peers[consID].mapped
		tr.mu.Unlock()
		base := uint64(uintptr(unsafe.Pointer(&mapped[0])))
		maps, err := readMaps(base, base+uint64(len(mapped)))
		require.NoError(t, err)
		require.Len(t, maps, 1)
		m := maps[0]
		assert.Equal(t, uint64(3*page), m.offset, "from the page holding the first granted row")
		assert.Equal(t, uint64((96+rows*rowLen+page-1)/page*page), m.end-m.start, "to the page holding the last")
	})
}

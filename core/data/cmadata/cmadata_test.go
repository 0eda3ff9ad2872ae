package cmadata

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/data"
)

const childEnv = "PEERKV_CMADATA_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	os.Exit(m.Run())
}

func region(rows, rowLen int, seed byte) data.Region {
	mem := make([]byte, rows*rowLen)
	for i := range mem {
		mem[i] = byte(i*7) ^ seed ^ byte(i/rowLen)
	}
	return data.Region{Mem: mem, RowLen: uint64(rowLen)}
}

func newTransport(t *testing.T, r data.Region) *Transport {
	t.Helper()
	tr, err := New(Options{Region: r, Workers: 3})
	require.NoError(t, err)
	t.Cleanup(func() { _ = tr.Close() })
	return tr
}

func infoOf(tr *Transport, r data.Region) data.PeerInfo {
	return data.PeerInfo{LocalProcess: tr.LocalProcess(), BaseAddr: r.BaseAddr(), NumRows: r.NumRows(), RowLen: r.RowLen}
}

func wait(t *testing.T, tr *Transport, id uint64) {
	t.Helper()
	select {
	case c := <-tr.Completions():
		require.Equal(t, id, c.ID)
		require.NoError(t, c.Err)
	case <-time.After(10 * time.Second):
		t.Fatal("no completion within 10s")
	}
}

func TestCopiesEveryRowAndNothingElse(t *testing.T) {
	const rows, rowLen = 2600, 64 // more rows than one process_vm_writev takes
	srcR, dstR := region(rows, rowLen, 1), region(rows, rowLen, 2)
	before := bytes.Clone(dstR.Mem)
	a, b := newTransport(t, srcR), newTransport(t, dstR)
	require.NoError(t, a.AddPeer("b", infoOf(b, dstR)))

	// Consecutive runs (merged into one iovec), scattered rows and a
	// reversed run, 2400 rows in all.
	var src, dst []uint64
	for i := range uint64(1200) {
		src, dst = append(src, i), append(dst, i+100)
	}
	for i := range uint64(1200) {
		src, dst = append(src, 1300+i*7%1200), append(dst, rows-1-i)
	}
	id, err := a.Write("b", src, dst)
	require.NoError(t, err)
	wait(t, a, id)

	written := map[uint64]uint64{}
	for i := range src {
		written[dst[i]] = src[i]
	}
	for row := range uint64(rows) {
		if s, ok := written[row]; ok {
			require.Equal(t, srcR.Row(s), dstR.Row(row), "row %d must hold source row %d", row, s)
		} else {
			require.Equal(t, before[row*rowLen:(row+1)*rowLen], dstR.Row(row), "row %d must be untouched", row)
		}
	}
}

func TestRefusesPeersItCannotReach(t *testing.T) {
	r := region(4, 64, 1)
	a := newTransport(t, r)
	me := a.me
	for name, c := range map[string]struct {
		locator string
		want    string
	}{
		"other host": {process{host: "other-boot/pid_[1]", pid: me.pid, start: me.start}.String(), "another host"},
		"malformed":  {"not a locator", "want boot-id/pid-ns/pid/start"},
		"reused pid": {process{host: me.host, pid: me.pid, start: me.start + 1}.String(), "another process"},
		"gone":       {process{host: me.host, pid: exitedPid(t), start: 1}.String(), "gone"},
	} {
		t.Run(name, func(t *testing.T) {
			info := data.PeerInfo{LocalProcess: c.locator, BaseAddr: r.BaseAddr(), NumRows: 4, RowLen: 64}
			err := a.AddPeer("x", info)
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
	info := infoOf(a, r)
	info.RowLen = 128
	assert.ErrorContains(t, a.AddPeer("x", info), "row length")
}

// exitedPid returns the pid of a child that has exited and been reaped.
func exitedPid(t *testing.T) int {
	cmd := exec.Command("true")
	require.NoError(t, cmd.Run())
	return cmd.Process.Pid
}

func TestBadWritesFailAtOnce(t *testing.T) {
	srcR, dstR := region(4, 64, 1), region(2, 64, 2)
	a, b := newTransport(t, srcR), newTransport(t, dstR)
	_, err := a.Write("b", []uint64{0}, []uint64{0})
	assert.ErrorIs(t, err, data.ErrUnknownPeer)
	require.NoError(t, a.AddPeer("b", infoOf(b, dstR)))
	_, err = a.Write("b", []uint64{0}, []uint64{2})
	assert.ErrorIs(t, err, data.ErrRowOutOfRange, "the peer has 2 rows")
	_, err = a.Write("b", []uint64{4}, []uint64{0})
	assert.ErrorIs(t, err, data.ErrRowOutOfRange, "we have 4 rows")
	_, err = a.Write("b", []uint64{0, 1}, []uint64{0})
	assert.Error(t, err)
	a.RemovePeer("b")
	_, err = a.Write("b", []uint64{0}, []uint64{0})
	assert.ErrorIs(t, err, data.ErrUnknownPeer)

	require.NoError(t, a.Close())
	_, err = a.Write("b", []uint64{0}, []uint64{0})
	assert.ErrorIs(t, err, data.ErrClosed)
	_, open := <-a.Completions()
	assert.False(t, open, "Completions is closed after Close")
}

// The real case: the consumer is another process.
func TestWritesIntoAnotherProcess(t *testing.T) {
	const rows, rowLen = 64, 4096
	self, err := os.Executable()
	require.NoError(t, err)
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := bufio.NewScanner(stdout)

	require.True(t, lines.Scan(), "child said nothing")
	var locator string
	var base uint64
	_, err = fmt.Sscanf(lines.Text(), "ready %s %d", &locator, &base)
	require.NoError(t, err, lines.Text())

	src := region(rows, rowLen, 9)
	a := newTransport(t, src)
	require.NoError(t, a.AddPeer("child", data.PeerInfo{LocalProcess: locator, BaseAddr: base, NumRows: rows, RowLen: rowLen}))
	all := make([]uint64, rows)
	for i := range all {
		all[i] = uint64(i)
	}
	id, err := a.Write("child", all, all)
	require.NoError(t, err)
	wait(t, a, id)

	sum := sha256.Sum256(src.Mem)
	_, err = fmt.Fprintf(stdin, "%s\n", hex.EncodeToString(sum[:]))
	require.NoError(t, err)
	require.True(t, lines.Scan())
	assert.Equal(t, "match", lines.Text())
}

// runChild holds a zeroed region, prints its locator and address, and
// reports whether its content hashes to the digest read from stdin.
func runChild() int {
	r := data.Region{Mem: make([]byte, 64*4096), RowLen: 4096}
	tr, err := New(Options{Region: r})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer tr.Close()
	fmt.Printf("ready %s %d\n", tr.LocalProcess(), r.BaseAddr())
	in := bufio.NewScanner(os.Stdin)
	if !in.Scan() {
		return 1
	}
	sum := sha256.Sum256(r.Mem)
	if strings.TrimSpace(in.Text()) == hex.EncodeToString(sum[:]) {
		fmt.Println("match")
	} else {
		fmt.Println("mismatch")
	}
	return 0
}

package nixl

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// PythonEnv names the Python (with vLLM and nixl) used for interop tests.
const pythonEnv = "PEERKV_TEST_PYTHON"

// goPeer starts the test binary as a Go peer in another process.
func goPeer(t *testing.T, env ...string) *peerProc {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=peer",
		fmt.Sprintf("PEER_ROWS=%d", testRows), fmt.Sprintf("PEER_ROW_LEN=%d", testRowLen), "PEER_SEED=22")
	cmd.Env = append(cmd.Env, env...)
	return startPeer(t, cmd)
}

// TestTwoProcessesGoToGo also runs with UCX on tcp alone, where a WRITE
// lands only if the target's progress thread (asleep in poll() between
// passes, see ProgressDelay) wakes for it.
func TestTwoProcessesGoToGo(t *testing.T) {
	requireNIXL(t)
	t.Run("default", func(t *testing.T) { exchangeWithPeer(t, goPeer(t), 22) })
	t.Run("UCX_TLS=tcp", func(t *testing.T) {
		t.Setenv("UCX_TLS", "tcp") // both processes: UCX reads it at agent creation
		exchangeWithPeer(t, goPeer(t), 22)
	})
}

// TestWriteIntoPeerWithoutProgressThreadStalls is the control for the
// above: with no progress thread in the target, nothing progresses its UCX
// worker (a one-sided WRITE makes no call there), so a write into it never
// completes. This is why the progress thread stays on and sleeps instead.
func TestWriteIntoPeerWithoutProgressThreadStalls(t *testing.T) {
	requireNIXL(t)
	t.Setenv("UCX_TLS", "tcp") // a tcp put needs the target to read its socket
	p := goPeer(t, "PEER_NO_PROGRESS_THREAD=1")
	local := newTestTransport(t, 11)
	info, err := p.hello.peerInfo()
	if err != nil {
		t.Fatal(err)
	}
	if err := local.AddPeer("remote", info); err != nil {
		t.Fatalf("AddPeer(remote): %v", err)
	}
	err = writeAndWait(local, "remote", []uint64{0}, []uint64{0}, 3*time.Second)
	if err == nil || !strings.Contains(err.Error(), "not complete after") {
		t.Fatalf("a write into a peer without a progress thread should stall; got %v", err)
	}
}

// TestInteropWithVLLMNixlTransport runs stock vLLM's Python NixlTransport in
// another process: Go writes into its region and it writes into Go's, the
// mixed-cluster case.
func TestInteropWithVLLMNixlTransport(t *testing.T) {
	requireNIXL(t)
	python := os.Getenv(pythonEnv)
	if python == "" {
		python = "../.venv/bin/python"
	}
	if _, err := os.Stat(python); err != nil {
		if os.Getenv("PEERKV_REQUIRE_NIXL") == "1" {
			t.Fatalf("no Python for the interop peer (%s=%q): %v", pythonEnv, python, err)
		}
		t.Skipf("no Python for the interop peer (set %s): %v", pythonEnv, err)
	}
	script, _ := filepath.Abs("testdata/vllm_peer.py")
	cmd := exec.Command(python, script, fmt.Sprint(testRows), fmt.Sprint(testRowLen), "33")
	exchangeWithPeer(t, startPeer(t, cmd), 33)
}

// exchangeWithPeer connects a local Go transport with a peer process both
// ways, writes in each direction and checks every byte of both regions.
func exchangeWithPeer(t *testing.T, p *peerProc, peerSeed int) {
	local := newTestTransport(t, 11)
	info, err := p.hello.peerInfo()
	if err != nil {
		t.Fatal(err)
	}
	if err := local.AddPeer("remote", info); err != nil {
		t.Fatalf("AddPeer(remote): %v", err)
	}
	p.request(peerMsg{Op: "add_peer", AgentMetadata: helloFor(local, testRows, testRowLen).AgentMetadata,
		BaseAddr: local.BaseAddr(), NumRows: testRows, RowLen: testRowLen})

	size := testRows * testRowLen
	wantLocal, wantRemote := fillPattern(11, size), fillPattern(peerSeed, size)
	allRows := make([]uint64, testRows)
	for i := range allRows {
		allRows[i] = uint64(i)
	}

	// Go → peer, twice (the second reuses the connection).
	for _, w := range []struct{ src, dst []uint64 }{
		{[]uint64{0, 1, 2, 3, 17}, []uint64{31, 30, 29, 28, 5}},
		{[]uint64{8}, []uint64{0}},
	} {
		if err := writeAndWait(local, "remote", w.src, w.dst, 20*time.Second); err != nil {
			t.Fatalf("Go → peer %v→%v: %v", w.src, w.dst, err)
		}
		applyWrite(wantRemote, wantLocal, w.src, w.dst, testRowLen)
	}
	expectRegion(t, "peer region after Go wrote", p.rows(allRows), wantRemote, testRowLen)

	// peer → Go, including rows Go wrote there.
	src, dst := []uint64{31, 5, 12}, []uint64{4, 20, 21}
	p.request(peerMsg{Op: "write", Src: src, Dst: dst})
	applyWrite(wantLocal, wantRemote, src, dst, testRowLen)
	expectRegion(t, "Go region after peer wrote", local.opts.Region.Mem, wantLocal, testRowLen)
}

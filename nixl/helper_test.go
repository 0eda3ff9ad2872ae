package nixl

import (
	"bufio"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/peerkv/peerkv/core/data"
)

// The test binary doubles as a Go NIXL peer in another process when this
// variable is set (see runGoPeer).
const helperEnv = "PEERKV_NIXL_TEST_HELPER"

func TestMain(m *testing.M) {
	switch os.Getenv(helperEnv) {
	case "":
		useRepoVenv()
		os.Exit(m.Run())
	case "peer":
		os.Exit(runGoPeer())
	case "load":
		os.Exit(runLoadProbe())
	case "nilpanic":
		os.Exit(runNilPanicProbe())
	default:
		fmt.Fprintf(os.Stderr, "unknown %s mode\n", helperEnv)
		os.Exit(2)
	}
}

// useRepoVenv points NIXL discovery at the repository's .venv (which holds
// the nixl wheels) when the environment names none, so a plain `go test`
// exercises NIXL wherever the venv exists.
func useRepoVenv() {
	if os.Getenv(LibEnv) != "" || os.Getenv("VIRTUAL_ENV") != "" {
		return
	}
	if venv, err := filepath.Abs("../.venv"); err == nil && fileExists(filepath.Join(venv, "bin", "python")) {
		_ = os.Setenv("VIRTUAL_ENV", venv)
	}
}

// requireNIXL skips (or, with PEERKV_REQUIRE_NIXL=1, fails) a test when NIXL
// cannot be loaded here, with the reason Available gives.
func requireNIXL(t testing.TB) {
	t.Helper()
	if ok, reason := Available(); !ok {
		if os.Getenv("PEERKV_REQUIRE_NIXL") == "1" {
			t.Fatalf("PEERKV_REQUIRE_NIXL=1 but %s", reason)
		}
		t.Skip(reason)
	}
}

// fillPattern is the region content every test peer starts with; the Python
// peer (testdata/vllm_peer.py) uses the same formula.
func fillPattern(seed, n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*131 + seed*17 + i/4093)
	}
	return b
}

// mmapRegion allocates a region outside the Go heap, as a host's is.
func mmapRegion(t testing.TB, numRows, rowLen, seed int) data.Region {
	mem, err := mmapRows(numRows, rowLen, seed)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Munmap(mem) })
	return data.Region{Mem: mem, RowLen: uint64(rowLen)}
}

func mmapRows(numRows, rowLen, seed int) ([]byte, error) {
	mem, err := syscall.Mmap(-1, 0, numRows*rowLen, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("mmap: %w", err)
	}
	copy(mem, fillPattern(seed, len(mem)))
	return mem, nil
}

// peerMsg is one line of the test peer protocol (testdata/vllm_peer.py).
type peerMsg struct {
	Op            string   `json:"op,omitempty"`
	AgentMetadata string   `json:"agent_metadata,omitempty"`
	BaseAddr      uint64   `json:"base_addr,omitempty"`
	NumRows       uint64   `json:"num_rows,omitempty"`
	RowLen        uint64   `json:"row_len,omitempty"`
	Src           []uint64 `json:"src,omitempty"`
	Dst           []uint64 `json:"dst,omitempty"`
	Rows          []uint64 `json:"rows,omitempty"`
	Data          string   `json:"data,omitempty"`
	OK            bool     `json:"ok,omitempty"`
	Error         string   `json:"error,omitempty"`
}

func (m peerMsg) peerInfo() (data.PeerInfo, error) {
	md, err := base64.StdEncoding.DecodeString(m.AgentMetadata)
	return data.PeerInfo{AgentMetadata: md, BaseAddr: m.BaseAddr, NumRows: m.NumRows, RowLen: m.RowLen}, err
}

func helloFor(tr *Transport, numRows, rowLen uint64) peerMsg {
	return peerMsg{
		AgentMetadata: base64.StdEncoding.EncodeToString(tr.AgentMetadata()),
		BaseAddr:      tr.BaseAddr(),
		NumRows:       numRows,
		RowLen:        rowLen,
	}
}

// runGoPeer serves the peer protocol with a Go transport (helper process).
func runGoPeer() int {
	numRows, _ := strconv.Atoi(os.Getenv("PEER_ROWS"))
	rowLen, _ := strconv.Atoi(os.Getenv("PEER_ROW_LEN"))
	seed, _ := strconv.Atoi(os.Getenv("PEER_SEED"))
	out := json.NewEncoder(os.Stdout)
	mem, err := mmapRows(numRows, rowLen, seed)
	if err != nil {
		_ = out.Encode(peerMsg{Error: err.Error()})
		return 1
	}
	tr, err := New(Options{Region: data.Region{Mem: mem, RowLen: uint64(rowLen)},
		NoProgressThread: os.Getenv("PEER_NO_PROGRESS_THREAD") == "1"})
	if err != nil {
		_ = out.Encode(peerMsg{Error: err.Error()})
		return 1
	}
	defer tr.Close()
	_ = out.Encode(helloFor(tr, uint64(numRows), uint64(rowLen)))
	in := bufio.NewReader(os.Stdin)
	for {
		line, err := in.ReadBytes('\n')
		if err != nil {
			return 1
		}
		var cmd peerMsg
		if err := json.Unmarshal(line, &cmd); err != nil {
			_ = out.Encode(peerMsg{Error: err.Error()})
			continue
		}
		reply := peerMsg{OK: true}
		switch cmd.Op {
		case "quit":
			_ = out.Encode(reply)
			return 0
		case "add_peer":
			info, err := cmd.peerInfo()
			if err == nil {
				err = tr.AddPeer("test-peer", info)
			}
			reply = okOrError(err)
		case "write":
			reply = okOrError(writeAndWait(tr, "test-peer", cmd.Src, cmd.Dst, 20*time.Second))
		case "rows":
			var buf []byte
			for _, r := range cmd.Rows {
				buf = append(buf, mem[int(r)*rowLen:(int(r)+1)*rowLen]...)
			}
			reply.Data = base64.StdEncoding.EncodeToString(buf)
		default:
			reply = peerMsg{Error: "unknown op " + cmd.Op}
		}
		_ = out.Encode(reply)
	}
}

func okOrError(err error) peerMsg {
	if err != nil {
		return peerMsg{Error: err.Error()}
	}
	return peerMsg{OK: true}
}

// writeAndWait writes and waits for that transfer's completion.
func writeAndWait(tr *Transport, peerID string, src, dst []uint64, timeout time.Duration) error {
	id, err := tr.Write(peerID, src, dst)
	if err != nil {
		return err
	}
	deadline := time.After(timeout)
	for {
		select {
		case c, ok := <-tr.Completions():
			if !ok {
				return errors.New("completions closed")
			}
			if c.ID == id {
				return c.Err
			}
		case <-deadline:
			return fmt.Errorf("transfer %d not complete after %v", id, timeout)
		}
	}
}

// runLoadProbe tries Load(PEER_LIB) in a fresh process and prints the error.
func runLoadProbe() int {
	_, err := Load(os.Getenv("PEER_LIB"))
	fmt.Println(err)
	return 0
}

// runNilPanicProbe creates a transport (UCX loaded and initialised), then
// dereferences nil: with UCX kept off the fault signals the Go runtime turns
// it into a recoverable panic.
func runNilPanicProbe() int {
	mem, err := mmapRows(4, 4096, 1)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	tr, err := New(Options{Region: data.Region{Mem: mem, RowLen: 4096}})
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer tr.Close()
	fmt.Println(recoverNilDeref())
	return 0
}

func recoverNilDeref() (msg string) {
	defer func() { msg = fmt.Sprint("recovered: ", recover()) }()
	var p *peerMsg
	return p.Op
}

// peerProc is a test peer in another process.
type peerProc struct {
	t     *testing.T
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan []byte
	hello peerMsg
}

const peerReplyTimeout = 60 * time.Second

func startPeer(t *testing.T, cmd *exec.Cmd) *peerProc {
	t.Helper()
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = &prefixWriter{t: t}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start peer %v: %v", cmd.Args, err)
	}
	p := &peerProc{t: t, cmd: cmd, stdin: stdin, lines: make(chan []byte, 4)}
	go func() {
		defer close(p.lines)
		r := bufio.NewReaderSize(stdout, 1<<20)
		for {
			line, err := r.ReadBytes('\n')
			if err != nil {
				return
			}
			p.lines <- line
		}
	}()
	t.Cleanup(p.stop)
	p.hello = p.read()
	if p.hello.Error != "" {
		t.Fatalf("peer failed to start: %s", p.hello.Error)
	}
	return p
}

func (p *peerProc) read() peerMsg {
	p.t.Helper()
	select {
	case line, ok := <-p.lines:
		if !ok {
			p.t.Fatalf("peer exited without replying")
		}
		var m peerMsg
		if err := json.Unmarshal(line, &m); err != nil {
			p.t.Fatalf("peer sent %q: %v", line, err)
		}
		return m
	case <-time.After(peerReplyTimeout):
		p.t.Fatalf("peer did not reply within %v", peerReplyTimeout)
	}
	return peerMsg{}
}

// request sends cmd and fails the test unless the peer answers ok.
func (p *peerProc) request(cmd peerMsg) peerMsg {
	p.t.Helper()
	line, _ := json.Marshal(cmd)
	if _, err := p.stdin.Write(append(line, '\n')); err != nil {
		p.t.Fatalf("send %s: %v", cmd.Op, err)
	}
	reply := p.read()
	if reply.Error != "" || !reply.OK {
		p.t.Fatalf("peer %s: %s", cmd.Op, reply.Error)
	}
	return reply
}

func (p *peerProc) rows(rows []uint64) []byte {
	p.t.Helper()
	b, err := base64.StdEncoding.DecodeString(p.request(peerMsg{Op: "rows", Rows: rows}).Data)
	if err != nil {
		p.t.Fatal(err)
	}
	return b
}

func (p *peerProc) stop() {
	line, _ := json.Marshal(peerMsg{Op: "quit"})
	_, _ = p.stdin.Write(append(line, '\n'))
	_ = p.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- p.cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			p.t.Errorf("peer exit: %v", err)
		}
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-done
		p.t.Errorf("peer did not exit within 30s; killed")
	}
}

// prefixWriter forwards a peer's stderr to the test log.
type prefixWriter struct{ t *testing.T }

func (w *prefixWriter) Write(b []byte) (int, error) {
	w.t.Logf("peer: %s", b)
	return len(b), nil
}

package nixl

import (
	"bytes"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/peerkv/peerkv/core/data"
)

const (
	testRows   = 32
	testRowLen = 16 << 10
)

func newTestTransport(t *testing.T, seed int) *Transport {
	t.Helper()
	return newSizedTransport(t, testRows, testRowLen, seed)
}

// newSizedTransport is newTestTransport over numRows rows of rowLen bytes.
func newSizedTransport(t testing.TB, numRows, rowLen, seed int) *Transport {
	t.Helper()
	tr, err := New(Options{Region: mmapRegion(t, numRows, rowLen, seed)})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := tr.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return tr
}

func infoOf(tr *Transport) data.PeerInfo {
	return data.PeerInfo{
		AgentMetadata: tr.AgentMetadata(),
		BaseAddr:      tr.BaseAddr(),
		NumRows:       tr.opts.Region.NumRows(),
		RowLen:        tr.opts.Region.RowLen,
	}
}

// expectRegion checks every byte of got against want, naming the first bad row.
func expectRegion(t *testing.T, what string, got, want []byte, rowLen int) {
	t.Helper()
	if bytes.Equal(got, want) {
		return
	}
	for r := 0; r*rowLen < len(want); r++ {
		if !bytes.Equal(got[r*rowLen:(r+1)*rowLen], want[r*rowLen:(r+1)*rowLen]) {
			t.Fatalf("%s: row %d differs from the expected bytes", what, r)
		}
	}
	t.Fatalf("%s: length %d, want %d", what, len(got), len(want))
}

// applyWrite is the model: dst rows of want become src rows of from.
func applyWrite(want, from []byte, src, dst []uint64, rowLen int) {
	for i := range src {
		copy(want[int(dst[i])*rowLen:(int(dst[i])+1)*rowLen], from[int(src[i])*rowLen:(int(src[i])+1)*rowLen])
	}
}

func TestTwoAgentsOneProcessWriteEveryByte(t *testing.T) {
	requireNIXL(t)
	a, b := newTestTransport(t, 1), newTestTransport(t, 2)
	if err := a.AddPeer("b", infoOf(b)); err != nil {
		t.Fatalf("a.AddPeer: %v", err)
	}
	if err := b.AddPeer("a", infoOf(a)); err != nil {
		t.Fatalf("b.AddPeer: %v", err)
	}
	wantA, wantB := fillPattern(1, testRows*testRowLen), fillPattern(2, testRows*testRowLen)

	// a → b: scattered rows, out of order, one contiguous run.
	src, dst := []uint64{0, 5, 6, 7, 31}, []uint64{9, 2, 3, 4, 0}
	if err := writeAndWait(a, "b", src, dst, 20*time.Second); err != nil {
		t.Fatalf("a→b: %v", err)
	}
	applyWrite(wantB, wantA, src, dst, testRowLen)
	expectRegion(t, "b after a→b", b.opts.Region.Mem, wantB, testRowLen)
	expectRegion(t, "a after a→b", a.opts.Region.Mem, wantA, testRowLen)

	// b → a, including rows a just wrote into b.
	src, dst = []uint64{9, 2, 10}, []uint64{30, 1, 2}
	if err := writeAndWait(b, "a", src, dst, 20*time.Second); err != nil {
		t.Fatalf("b→a: %v", err)
	}
	applyWrite(wantA, wantB, src, dst, testRowLen)
	expectRegion(t, "a after b→a", a.opts.Region.Mem, wantA, testRowLen)
}

func TestConcurrentWritesCompleteOnceEach(t *testing.T) {
	requireNIXL(t)
	a, b := newTestTransport(t, 3), newTestTransport(t, 4)
	if err := a.AddPeer("b", infoOf(b)); err != nil {
		t.Fatal(err)
	}
	const writers = 8
	ids := make(chan uint64, testRows)
	var wg sync.WaitGroup
	for w := 0; w < writers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for r := w; r < testRows; r += writers {
				id, err := a.Write("b", []uint64{uint64(r)}, []uint64{uint64(testRows - 1 - r)})
				if err != nil {
					t.Errorf("Write row %d: %v", r, err)
					return
				}
				ids <- id
			}
		}(w)
	}
	wg.Wait()
	close(ids)
	pending := map[uint64]bool{}
	for id := range ids {
		if pending[id] {
			t.Fatalf("transfer id %d returned twice", id)
		}
		pending[id] = true
	}
	deadline := time.After(20 * time.Second)
	for len(pending) > 0 {
		select {
		case c := <-a.Completions():
			if !pending[c.ID] {
				t.Fatalf("unexpected or duplicate completion %+v", c)
			}
			if c.Err != nil || c.PeerID != "b" {
				t.Fatalf("completion %+v", c)
			}
			delete(pending, c.ID)
		case <-deadline:
			t.Fatalf("%d transfers not complete", len(pending))
		}
	}
	want := fillPattern(4, testRows*testRowLen)
	from := fillPattern(3, testRows*testRowLen)
	for r := 0; r < testRows; r++ {
		applyWrite(want, from, []uint64{uint64(r)}, []uint64{uint64(testRows - 1 - r)}, testRowLen)
	}
	expectRegion(t, "b", b.opts.Region.Mem, want, testRowLen)
}

func TestWriteErrors(t *testing.T) {
	requireNIXL(t)
	a, b := newTestTransport(t, 5), newTestTransport(t, 6)
	if _, err := a.Write("nobody", []uint64{0}, []uint64{0}); !errors.Is(err, data.ErrUnknownPeer) || !strings.Contains(err.Error(), "nobody") {
		t.Fatalf("write to unknown peer: %v", err)
	}
	if err := a.AddPeer("b", infoOf(b)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Write("b", []uint64{testRows}, []uint64{0}); !errors.Is(err, data.ErrRowOutOfRange) {
		t.Fatalf("local row out of range: %v", err)
	}
	if _, err := a.Write("b", []uint64{0}, []uint64{testRows}); !errors.Is(err, data.ErrRowOutOfRange) {
		t.Fatalf("remote row out of range: %v", err)
	}
	if _, err := a.Write("b", []uint64{0, 1}, []uint64{0}); err == nil {
		t.Fatal("mismatched row lists accepted")
	}
	if _, err := a.Write("b", nil, nil); err == nil {
		t.Fatal("empty write accepted")
	}
	a.RemovePeer("b")
	if _, err := a.Write("b", []uint64{0}, []uint64{0}); !errors.Is(err, data.ErrUnknownPeer) {
		t.Fatalf("write after RemovePeer: %v", err)
	}
	// Re-adding works after removal.
	if err := a.AddPeer("b", infoOf(b)); err != nil {
		t.Fatalf("re-add: %v", err)
	}
	if err := writeAndWait(a, "b", []uint64{1}, []uint64{1}, 20*time.Second); err != nil {
		t.Fatalf("write after re-add: %v", err)
	}
}

// Write is called under the tier's lock: it must not wait while the owner
// goroutine is busy (adding a peer loads its metadata). A write queued then
// is posted afterwards, or reported failed if its peer went (or went and
// came back) meanwhile.
func TestWriteDoesNotWaitForABusyOwner(t *testing.T) {
	requireNIXL(t)
	a, b := newTestTransport(t, 11), newTestTransport(t, 12)
	if err := a.AddPeer("b", infoOf(b)); err != nil {
		t.Fatal(err)
	}
	// busyOwner holds the owner in a call until release, then runs then on it.
	busyOwner := func(then func()) (release func()) {
		ch, done := make(chan struct{}), make(chan error, 1)
		go func() { done <- a.do(func() { <-ch; then() }) }()
		time.Sleep(50 * time.Millisecond) // the owner is in the call now
		return func() {
			close(ch)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}
	}
	timedWrite := func(src, dst uint64) uint64 {
		started := time.Now()
		id, err := a.Write("b", []uint64{src}, []uint64{dst})
		if err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(started); waited > 20*time.Millisecond {
			t.Fatalf("Write waited %v for the busy owner", waited)
		}
		return id
	}
	completion := func(id uint64) error {
		deadline := time.After(20 * time.Second)
		for {
			select {
			case c := <-a.Completions():
				if c.ID == id {
					return c.Err
				}
			case <-deadline:
				t.Fatalf("write %d not reported", id)
			}
		}
	}

	release := busyOwner(func() {})
	id := timedWrite(2, 5)
	release()
	if err := completion(id); err != nil {
		t.Fatalf("write queued behind a busy owner: %v", err)
	}
	want := fillPattern(12, testRows*testRowLen)
	applyWrite(want, fillPattern(11, testRows*testRowLen), []uint64{2}, []uint64{5}, testRowLen)
	expectRegion(t, "b", b.opts.Region.Mem, want, testRowLen)

	// The peer goes and comes back (a new session) before the queued post
	// runs: the write fails and its rows never reach the new registration.
	release = busyOwner(func() {
		a.removePeer("b", ErrPeerRemoved)
		if err := a.addPeer("b", infoOf(b)); err != nil {
			t.Error(err)
		}
	})
	id = timedWrite(3, 6)
	release()
	if err := completion(id); !errors.Is(err, ErrPeerRemoved) {
		t.Fatalf("write whose peer was re-added before it was posted: %v", err)
	}
	time.Sleep(50 * time.Millisecond)
	expectRegion(t, "b", b.opts.Region.Mem, want, testRowLen)

	release = busyOwner(func() { a.removePeer("b", ErrPeerRemoved) })
	id = timedWrite(3, 6)
	release()
	if err := completion(id); !errors.Is(err, ErrPeerRemoved) {
		t.Fatalf("write whose peer went before it was posted: %v", err)
	}
	if _, err := a.Write("b", []uint64{0}, []uint64{0}); !errors.Is(err, data.ErrUnknownPeer) {
		t.Fatalf("write after the peer went: %v", err)
	}
}

func TestAddPeerRejectsBadInfo(t *testing.T) {
	requireNIXL(t)
	a, b := newTestTransport(t, 7), newTestTransport(t, 8)
	good := infoOf(b)
	cases := map[string]func(*data.PeerInfo){
		"no metadata":      func(i *data.PeerInfo) { i.AgentMetadata = nil },
		"garbage metadata": func(i *data.PeerInfo) { i.AgentMetadata = []byte("not nixl metadata") },
		"row length":       func(i *data.PeerInfo) { i.RowLen++ },
		"no rows":          func(i *data.PeerInfo) { i.NumRows = 0 },
	}
	for name, mutate := range cases {
		info := good
		mutate(&info)
		if err := a.AddPeer("b", info); err == nil {
			t.Errorf("%s: AddPeer accepted it", name)
		}
	}
	if err := a.AddPeer("b", good); err != nil {
		t.Fatalf("good info after bad: %v", err)
	}
	if err := a.AddPeer("b-again", good); err == nil || !strings.Contains(err.Error(), "already added") {
		t.Fatalf("same agent under a second peer id: %v", err)
	}
}

func TestCloseIsIdempotentAndEndsEverything(t *testing.T) {
	requireNIXL(t)
	b := newTestTransport(t, 10)
	a, err := New(Options{Region: mmapRegion(t, testRows, testRowLen, 9)})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.AddPeer("b", infoOf(b)); err != nil {
		t.Fatal(err)
	}
	id, err := a.Write("b", []uint64{0, 1, 2}, []uint64{3, 4, 5})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := a.Write("b", []uint64{0}, []uint64{0}); !errors.Is(err, data.ErrClosed) {
		t.Fatalf("Write after Close: %v", err)
	}
	if err := a.AddPeer("c", infoOf(b)); !errors.Is(err, data.ErrClosed) {
		t.Fatalf("AddPeer after Close: %v", err)
	}
	// The write reports exactly once (done, or failed by Close), then the
	// channel closes.
	var got []data.Completion
	timeout := time.After(10 * time.Second)
	for open := true; open; {
		select {
		case c, ok := <-a.Completions():
			if ok {
				got = append(got, c)
			}
			open = ok
		case <-timeout:
			t.Fatal("Completions not closed after Close")
		}
	}
	if len(got) != 1 || got[0].ID != id {
		t.Fatalf("completions after Close: %+v", got)
	}
	if got[0].Err != nil && !errors.Is(got[0].Err, data.ErrClosed) {
		t.Fatalf("failed transfer names %v, want ErrClosed", got[0].Err)
	}
}

func TestTransferTimeoutFails(t *testing.T) {
	requireNIXL(t)
	// A nanosecond budget expires before the first poll unless NIXL
	// finished the WRITE while posting it; both outcomes are checked.
	b := newTestTransport(t, 12)
	a, err := New(Options{Region: mmapRegion(t, testRows, testRowLen, 11), TransferTimeout: time.Nanosecond})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if err := a.AddPeer("b", infoOf(b)); err != nil {
		t.Fatal(err)
	}
	err = writeAndWait(a, "b", []uint64{0, 1, 2, 3}, []uint64{0, 1, 2, 3}, 10*time.Second)
	if err != nil && !errors.Is(err, ErrTransferTimeout) {
		t.Fatalf("want nil or ErrTransferTimeout, got %v", err)
	}
	t.Logf("outcome with a 1ns budget: %v", err)
}

func TestLoadFailuresNameTheCause(t *testing.T) {
	// Each probe runs in a fresh process: Load is once per process.
	bogus := filepath.Join(t.TempDir(), "libnixl_capi.so")
	if err := os.WriteFile(bogus, []byte("not an ELF file"), 0o644); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]string{
		bogus:                                   "NIXL unavailable: " + bogus + ": dlopen: ",
		filepath.Join(t.TempDir(), "absent.so"): "NIXL unavailable: ",
		"/lib/x86_64-linux-gnu/libc.so.6":       "missing symbol nixl_capi_is_stub",
	} {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), helperEnv+"=load", "PEER_LIB="+path)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("probe %s: %v\n%s", path, err, out)
		}
		if !strings.Contains(string(out), want) {
			t.Errorf("Load(%s) = %q, want it to contain %q", path, strings.TrimSpace(string(out)), want)
		}
	}
	t.Setenv(LibEnv, "/nonexistent/libnixl_capi.so")
	if _, err := FindLibrary(); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "/nonexistent/libnixl_capi.so") {
		t.Fatalf("FindLibrary with a bad %s: %v", LibEnv, err)
	}
}

// TestGoNilPanicSurvivesUCX checks the environment New sets up: with UCX
// loaded and initialised, a Go nil dereference is still a recoverable panic.
// The control run turns UCX's fault handlers on and must crash, proving the
// probe detects UCX stealing SIGSEGV.
func TestGoNilPanicSurvivesUCX(t *testing.T) {
	requireNIXL(t)
	probe := func(env ...string) (string, error) {
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(withoutUCXErrorEnv(os.Environ()), append(env, helperEnv+"=nilpanic")...)
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	out, err := probe()
	if err != nil || !strings.Contains(out, "recovered: runtime error: invalid memory address or nil pointer dereference") {
		t.Fatalf("with peerkv's UCX defaults the nil dereference was not recovered (%v):\n%s", err, out)
	}
	out, err = probe("UCX_HANDLE_ERRORS=bt", "UCX_ERROR_SIGNALS=SIGILL,SIGSEGV,SIGBUS,SIGFPE")
	if err == nil || strings.Contains(out, "recovered:") || !strings.Contains(out, "Caught signal 11") {
		t.Fatalf("control: with UCX fault handlers on the probe should crash in UCX's handler (%v):\n%s", err, out)
	}
}

func withoutUCXErrorEnv(env []string) []string {
	var kept []string
	for _, kv := range env {
		if !strings.HasPrefix(kv, "UCX_HANDLE_ERRORS=") && !strings.HasPrefix(kv, "UCX_ERROR_SIGNALS=") {
			kept = append(kept, kv)
		}
	}
	return kept
}

// TestIdleProgressThreadSleeps checks that connected agents with no
// transfer cost next to no CPU: NIXL's progress thread sleeps in poll()
// (ProgressDelay) instead of spinning. The control, NIXL's own default
// (ProgressDelay < 0, what Python nixl runs), spins, proving the figure
// catches a spinning thread.
func TestIdleProgressThreadSleeps(t *testing.T) {
	requireNIXL(t)
	idleCPU := func(delay time.Duration) float64 {
		a, err := New(Options{Region: mmapRegion(t, testRows, testRowLen, 1), ProgressDelay: delay})
		if err != nil {
			t.Fatal(err)
		}
		defer a.Close()
		b, err := New(Options{Region: mmapRegion(t, testRows, testRowLen, 2), ProgressDelay: delay})
		if err != nil {
			t.Fatal(err)
		}
		defer b.Close()
		for _, w := range []struct {
			from, to *Transport
			name     string
		}{{a, b, "b"}, {b, a, "a"}} {
			if err := w.from.AddPeer(w.name, infoOf(w.to)); err != nil {
				t.Fatal(err)
			}
			if err := writeAndWait(w.from, w.name, []uint64{0}, []uint64{1}, 20*time.Second); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(100 * time.Millisecond) // connection set-up settles
		before, start := processCPU(t), time.Now()
		time.Sleep(time.Second)
		return 100 * (processCPU(t) - before).Seconds() / time.Since(start).Seconds()
	}
	sleeping := idleCPU(0)
	spinning := idleCPU(-1)
	for try := 1; try < 3 && spinning < 5*sleeping+5; try++ { // a loaded host may starve the spinning thread
		spinning = max(spinning, idleCPU(-1))
	}
	t.Logf("idle CPU, two connected agents: %.1f %% of a core with the default ProgressDelay, %.1f %% spinning", sleeping, spinning)
	if sleeping > 10 {
		t.Errorf("idle agents used %.1f %% of a core; the progress thread should sleep", sleeping)
	}
	if spinning < 5*sleeping+5 {
		t.Errorf("control: spinning progress threads used only %.1f %% of a core (sleeping ones %.1f %%)", spinning, sleeping)
	}
}

// processCPU is this process's user and system CPU time, every thread.
func processCPU(t *testing.T) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// A write canceled before the owner posted it is reported canceled and
// writes nothing; the next write goes through.
func TestCancelDropsAWriteNotYetPosted(t *testing.T) {
	requireNIXL(t)
	a, b := newTestTransport(t, 11), newTestTransport(t, 12)
	if err := a.AddPeer("b", infoOf(b)); err != nil {
		t.Fatal(err)
	}
	ch, done := make(chan struct{}), make(chan error, 1)
	go func() { done <- a.do(func() { <-ch }) }()
	time.Sleep(50 * time.Millisecond) // the owner is in the call now
	id, err := a.Write("b", []uint64{2}, []uint64{5})
	if err != nil {
		t.Fatal(err)
	}
	var c data.Canceler = a
	c.Cancel("other", id) // not its peer: nothing happens
	c.Cancel("b", id)
	close(ch)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-a.Completions():
		if got.ID != id || !errors.Is(got.Err, data.ErrCanceled) {
			t.Fatalf("completion %+v, want %d canceled", got, id)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the canceled write was not reported")
	}
	time.Sleep(50 * time.Millisecond)
	expectRegion(t, "b", b.opts.Region.Mem, fillPattern(12, testRows*testRowLen), testRowLen)

	if err := writeAndWait(a, "b", []uint64{2}, []uint64{5}, 10*time.Second); err != nil {
		t.Fatalf("the next write: %v", err)
	}
}

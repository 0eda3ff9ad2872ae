package zmqctl

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/control"
)

// The memory tests measure a Transport in a process of its own (this test
// binary re-executed with victimEnv set to a victimSpec), so that what the
// attackers in the test process hold is not counted.
const victimEnv = "PEERKV_ZMQCTL_TEST_VICTIM"

func TestMain(m *testing.M) {
	if spec := os.Getenv(victimEnv); spec != "" {
		os.Exit(runVictim(spec))
	}
	os.Exit(m.Run())
}

// victimSpec configures the victim's Transport; durations in ms, zero
// fields take the defaults.
type victimSpec struct {
	MaxFrameBytes    int
	SendTimeoutMS    int
	UnheardTimeoutMS int
	EventBuffer      int
	ConsumeDelayMS   int // per frame: a consumer slower than the attack
}

// runVictim binds a Transport on a free port, prints "id ID", then reports
// "frame PEER" for each frame from an identity starting with "legit" and
// "down PEER ERR" for each lost peer, and answers commands on stdin:
// "rss" (resident bytes, after returning freed memory), "stats" (JSON) and
// "send PEER SIZE N EVERY_MS" (N frames, stopped by the peer's loss).
func runVictim(specJSON string) int {
	var spec victimSpec
	if err := json.Unmarshal([]byte(specJSON), &spec); err != nil {
		fmt.Fprintln(os.Stderr, "victim spec:", err)
		return 2
	}
	opts := Options{
		MaxFrameBytes:  spec.MaxFrameBytes,
		SendTimeout:    time.Duration(spec.SendTimeoutMS) * time.Millisecond,
		UnheardTimeout: time.Duration(spec.UnheardTimeoutMS) * time.Millisecond,
		EventBuffer:    spec.EventBuffer,
		Logger:         slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	var tr *Transport
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			continue
		}
		port := l.Addr().(*net.TCPAddr).Port
		_ = l.Close()
		if tr, err = New(fmt.Sprintf("127.0.0.1:%d", port), "127.0.0.1", port, opts); err == nil {
			break
		}
	}
	if tr == nil {
		fmt.Fprintln(os.Stderr, "victim: no port")
		return 2
	}
	defer tr.Close()
	var outMu sync.Mutex
	say := func(format string, args ...any) {
		outMu.Lock()
		defer outMu.Unlock()
		fmt.Printf(format+"\n", args...)
	}
	say("id %s", tr.LocalID())
	var downs sync.Map // peer id -> *atomic.Bool
	downFlag := func(peer string) *atomic.Bool {
		f, _ := downs.LoadOrStore(peer, new(atomic.Bool))
		return f.(*atomic.Bool)
	}
	go func() {
		for ev := range tr.Events() {
			switch ev.Kind {
			case control.EventFrame:
				if strings.HasPrefix(ev.PeerID, "legit") {
					say("frame %s", ev.PeerID)
				}
				time.Sleep(time.Duration(spec.ConsumeDelayMS) * time.Millisecond)
			case control.EventPeerDown:
				downFlag(ev.PeerID).Store(true)
				say("down %s %v", ev.PeerID, ev.Err)
			}
		}
	}()
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		f := strings.Fields(in.Text())
		switch {
		case len(f) == 1 && f[0] == "rss":
			runtime.GC()
			debug.FreeOSMemory()
			say("rss %d", residentBytes())
		case len(f) == 1 && f[0] == "stats":
			b, _ := json.Marshal(tr.Stats())
			say("stats %s", b)
		case len(f) == 5 && f[0] == "send":
			size, _ := strconv.Atoi(f[2])
			n, _ := strconv.Atoi(f[3])
			every, _ := strconv.Atoi(f[4])
			peer, down := f[1], downFlag(f[1])
			payload := make([]byte, size) // Send copies it
			go func() {
				for i := 0; i < n && !down.Load(); i++ {
					_ = tr.Send(peer, payload)
					time.Sleep(time.Duration(every) * time.Millisecond)
				}
			}()
			say("ok")
		default:
			say("bad command %q", in.Text())
		}
	}
	return 0
}

// residentBytes reads this process's RSS.
func residentBytes() uint64 {
	statm, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(statm))
	if len(fields) < 2 {
		return 0
	}
	pages, _ := strconv.ParseUint(fields[1], 10, 64)
	return pages * uint64(os.Getpagesize())
}

// victim is the parent's handle on a victim process.
type victim struct {
	id      string
	stdin   io.WriteCloser
	replies chan string // answers to commands
	events  chan string // "frame ..." and "down ..." lines
}

func startVictim(t *testing.T, spec victimSpec) *victim {
	t.Helper()
	specJSON, err := json.Marshal(spec)
	require.NoError(t, err)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	// A fixed mmap threshold: glibc then returns every large frame libzmq
	// frees to the OS, so RSS shows what is held, not what malloc kept.
	cmd.Env = append(os.Environ(), victimEnv+"="+string(specJSON), "MALLOC_MMAP_THRESHOLD_=65536")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	v := &victim{stdin: stdin, replies: make(chan string, 16), events: make(chan string, 1024)}
	ids := make(chan string, 1)
	go func() {
		lines := bufio.NewScanner(stdout)
		for lines.Scan() {
			line := lines.Text()
			switch {
			case strings.HasPrefix(line, "id "):
				ids <- strings.TrimPrefix(line, "id ")
			case strings.HasPrefix(line, "frame "), strings.HasPrefix(line, "down "):
				select {
				case v.events <- line:
				default:
				}
			default:
				v.replies <- line
			}
		}
		close(v.replies)
	}()
	t.Cleanup(func() {
		_ = stdin.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	select {
	case v.id = <-ids:
	case <-time.After(20 * time.Second):
		t.Fatal("the victim process did not start")
	}
	return v
}

func (v *victim) ask(t *testing.T, command string) string {
	t.Helper()
	_, err := fmt.Fprintln(v.stdin, command)
	require.NoError(t, err)
	select {
	case reply, ok := <-v.replies:
		require.True(t, ok, "the victim process exited")
		return reply
	case <-time.After(20 * time.Second):
		t.Fatalf("the victim did not answer %q", command)
		return ""
	}
}

func (v *victim) rss(t *testing.T) int64 {
	t.Helper()
	n, err := strconv.ParseInt(strings.TrimPrefix(v.ask(t, "rss"), "rss "), 10, 64)
	require.NoError(t, err)
	return n
}

func (v *victim) stats(t *testing.T) Stats {
	t.Helper()
	var st Stats
	require.NoError(t, json.Unmarshal([]byte(strings.TrimPrefix(v.ask(t, "stats"), "stats ")), &st))
	return st
}

// await waits for an event line starting with prefix.
func (v *victim) await(prefix string, within time.Duration) (string, bool) {
	deadline := time.After(within)
	for {
		select {
		case line := <-v.events:
			if strings.HasPrefix(line, prefix) {
				return line, true
			}
		case <-deadline:
			return "", false
		}
	}
}

package hostile

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/node"
	"github.com/peerkv/peerkv/core/tier"
)

// The victim of the availability tests is another process: this test binary
// re-executed with victimEnv set to a victimSpec (JSON). It runs one node
// and a host loop standing in for vLLM's scheduler thread, and answers one
// line per command on stdin (see runVictim), so the test can read the
// victim's own RSS and the latency of its host calls while it is attacked.
const victimEnv = "PEERKV_HOSTILE_VICTIM"

// victimRSSCeiling ends a victim that grows past it: on a node without the
// bounds the attacks can grow it by GBs, and the machine is shared.
const victimRSSCeiling = 1536 << 20

func TestMain(m *testing.M) {
	if spec := os.Getenv(victimEnv); spec != "" {
		os.Exit(runVictim(spec))
	}
	os.Exit(m.Run())
}

// victimSpec is what the parent asks of a victim.
type victimSpec struct {
	Options map[string]any // over baseOptions; host, port and data_port are the victim's
	Rows    int            // rows in its region (mapped, untouched but for the served rows)
	Served  string         // key space of the keys it holds in rows 0..servedKeys-1
}

const servedKeys = 4

// victimStat is one answer to "stat".
type victimStat struct {
	RSS, Peak int64 // VmRSS now, and the highest sampled since the last reset
	// Slowest is the slowest host call since the last reset, not counting
	// the time the kernel kept the calling thread waiting for a CPU (the
	// machine is shared; waits for our locks and our goroutines count);
	// SlowestWall is the slowest by the wall clock.
	Slowest, SlowestWall time.Duration
	SlowestCall          string // which call Slowest was
	Calls                int64  // host calls since the last reset
	Answered             int64  // inbound lookups the host answered, in all
	Sessions             int    // the node's sessions now
	FramesIn             int64  // control frames the node received, in all
}

func (s victimStat) String() string {
	return fmt.Sprintf("rss %s, peak %s, slowest host call %v (%s; %v by the wall clock) of %d, %d sessions",
		inMiB(s.RSS), inMiB(s.Peak), s.Slowest, s.SlowestCall, s.SlowestWall, s.Calls, s.Sessions)
}

func inMiB(b int64) string { return fmt.Sprintf("%d MiB", b>>20) }

// runVictim is the victim process; see victimEnv. Commands: "reset" (peak RSS
// and slowest call start again from now), "stat" (a victimStat as JSON),
// "logs" (the node's log lines so far, to stderr), "libzmq" (the libzmq
// files this process mapped, space-separated). It exits when stdin
// closes, and on its own when its RSS passes victimRSSCeiling.
func runVictim(raw string) int {
	fail := func(format string, args ...any) int {
		fmt.Fprintf(os.Stderr, "victim: "+format+"\n", args...)
		return 2
	}
	var spec victimSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		return fail("spec: %v", err)
	}
	mem, err := syscall.Mmap(-1, 0, spec.Rows*RowLen, syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_ANON|syscall.MAP_PRIVATE|syscall.MAP_NORESERVE)
	if err != nil {
		return fail("region: %v", err)
	}
	region := data.Region{Mem: mem, RowLen: RowLen}
	held := map[string]int64{}
	for i, k := range Keys(spec.Served, servedKeys) {
		Fill(region.Row(uint64(i)), k)
		held[string(k)] = int64(i)
	}
	tr, dataAddr, err := openVictimNode(spec.Options, region)
	if err != nil {
		return fail("open: %v", err)
	}
	v := &victimHost{tr: tr, held: held}
	defer startVictimProfile(&v.watch)()
	v.resetStats()
	go v.sample()
	stop := make(chan struct{})
	loopDone := make(chan struct{})
	go func() { defer close(loopDone); v.hostLoop(stop) }()
	fmt.Printf("ready %s %s\n", tr.LocalID(), dataAddr)

	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch in.Text() {
		case "reset":
			v.resetStats()
			victimMemory.reset()
			fmt.Println("ok")
		case "stat":
			b, _ := json.Marshal(v.stat())
			fmt.Println(string(b))
		case "logs":
			fmt.Fprintf(os.Stderr, "victim %s logs:\n%s\n", tr.LocalID(), v.logTail())
			fmt.Println("ok")
		case "libzmq":
			fmt.Println(strings.Join(loadedLibzmq(), " "))
		default:
			fmt.Println("unknown command")
		}
	}
	close(stop)
	<-loopDone
	_ = tr.Shutdown()
	return 0
}

// openVictimNode opens the node at a free port (retrying a port another
// process took meanwhile) and returns its data address.
func openVictimNode(opts map[string]any, region data.Region) (*tier.Tier, string, error) {
	o := baseOptions()
	for k, v := range opts {
		o[k] = v
	}
	host, _ := o["host"].(string)
	var last error
	for range 6 {
		port, err1 := freePortOn(host)
		dport, err2 := freePortOn(host)
		if err1 != nil || err2 != nil {
			return nil, "", fmt.Errorf("no free port on %s: %v %v", host, err1, err2)
		}
		o["port"], o["data_port"] = port, dport
		raw, _ := json.Marshal(o)
		cfg, err := config.FromJSON(raw)
		if err != nil {
			return nil, "", fmt.Errorf("options %s: %w", raw, err)
		}
		tr, err := node.Open(cfg, region)
		if err == nil {
			return tr, net.JoinHostPort(host, strconv.Itoa(dport)), nil
		}
		last = err
	}
	return nil, "", last
}

// freePortOn is FreePort for a process without a testing.T.
func freePortOn(host string) (int, error) { return freePortBelowEphemeral(host) }

// victimHost is the host side of the victim: what vLLM's scheduler thread
// calls, timed.
type victimHost struct {
	tr   *tier.Tier
	held map[string]int64 // key -> row

	runWait func() time.Duration // the host thread's time waiting for a CPU so far
	watch   callWatch            // the call in progress, for victimProfileEnv

	mu          sync.Mutex
	slowest     time.Duration
	slowestWall time.Duration
	slowestCall string
	calls       int64
	peak        atomic.Int64
	rss         atomic.Int64
	answered    atomic.Int64
	logs        []byte
}

func (v *victimHost) resetStats() {
	v.mu.Lock()
	v.slowest, v.slowestWall, v.slowestCall, v.calls = 0, 0, "", 0
	v.mu.Unlock()
	r := readRSS()
	v.rss.Store(r)
	v.peak.Store(r)
}

func (v *victimHost) stat() victimStat {
	st := v.tr.Stats()
	v.mu.Lock()
	defer v.mu.Unlock()
	return victimStat{RSS: v.rss.Load(), Peak: v.peak.Load(), Slowest: v.slowest, SlowestWall: v.slowestWall,
		SlowestCall: v.slowestCall,
		Calls:       v.calls, Answered: v.answered.Load(), Sessions: st.Sessions, FramesIn: st.FramesIn}
}

// timed runs one host call and records its duration, with and without the
// time the kernel kept the host thread off the CPU meanwhile.
func (v *victimHost) timed(name string, call func()) {
	waited := v.runWait()
	start := time.Now()
	v.watch.begin(name)
	call()
	v.watch.end()
	wall := time.Since(start)
	d := wall - (v.runWait() - waited)
	v.mu.Lock()
	v.calls++
	v.slowestWall = max(v.slowestWall, wall)
	if d > v.slowest {
		v.slowest, v.slowestCall = d, name
	}
	v.mu.Unlock()
}

// threadRunWait returns a reader of the calling OS thread's time spent
// waiting on a run queue (the second field of its schedstat); the caller
// must stay locked to that thread.
func threadRunWait() func() time.Duration {
	f, err := os.Open("/proc/thread-self/schedstat")
	if err != nil {
		return func() time.Duration { return 0 }
	}
	buf := make([]byte, 128)
	return func() time.Duration {
		n, _ := f.ReadAt(buf, 0)
		if fields := strings.Fields(string(buf[:n])); len(fields) >= 2 {
			ns, _ := strconv.ParseInt(fields[1], 10, 64)
			return time.Duration(ns)
		}
		return 0
	}
}

// hostLoop is the scheduler thread: every millisecond it looks up a local
// request's keys, ends the step, polls finished jobs and serves the inbound
// lookups (HIT, pinned, for the keys it holds), each call timed.
func (v *victimHost) hostLoop(stop <-chan struct{}) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	v.runWait = threadRunWait()
	const req = "scheduler-request"
	v.timed("start_request", func() { _, _ = v.tr.StartRequest(req, nil) })
	keys := Keys("scheduler", 16)
	out := make([]tier.LookupResult, len(keys))
	pinJob := int64(1 << 40)
	for {
		select {
		case <-stop:
			return
		case <-time.After(time.Millisecond):
		}
		v.timed("lookup", func() { _ = v.tr.Lookup(req, keys, out) })
		v.timed("on_schedule_end", func() { _ = v.tr.OnScheduleEnd() })
		v.timed("get_finished", func() { v.tr.GetFinished(64) })
		for range 16 {
			var in tier.Inbound
			var ok bool
			v.timed("next_inbound", func() { in, ok, _ = v.tr.NextInbound(nil) })
			if !ok {
				break
			}
			if in.Kind != tier.InboundEvaluate {
				continue
			}
			res := make([]tier.LookupResult, len(in.Keys))
			var pins []int64
			for i, k := range in.Keys {
				res[i] = tier.Miss
				if row, hit := v.held[string(k)]; hit {
					res[i], pins = tier.Hit, append(pins, row)
				}
			}
			job := int64(-1)
			if len(pins) > 0 {
				pinJob++
				job = pinJob
			}
			v.timed("answer_inbound", func() { _, _ = v.tr.AnswerInbound(in.LookupID, res, job, pins) })
			v.answered.Add(1)
		}
	}
}

// sample reads VmRSS every 5 ms (keeping the peak), keeps the node's last
// log lines, and ends the process past victimRSSCeiling.
func (v *victimHost) sample() {
	for n := 0; ; n++ {
		r := readRSS()
		v.rss.Store(r)
		victimMemory.observe(r)
		for {
			p := v.peak.Load()
			if r <= p || v.peak.CompareAndSwap(p, r) {
				break
			}
		}
		if r > victimRSSCeiling {
			fmt.Fprintf(os.Stderr, "victim: RSS %s passed the test's ceiling of %s; exiting\n", inMiB(r), inMiB(victimRSSCeiling))
			os.Exit(3)
		}
		if n%20 == 0 {
			v.mu.Lock()
			v.logs = append(v.logs, v.tr.TakeLogs(1<<16)...)
			if len(v.logs) > 1<<16 {
				v.logs = v.logs[len(v.logs)-1<<16:]
			}
			v.mu.Unlock()
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func (v *victimHost) logTail() string {
	v.mu.Lock()
	defer v.mu.Unlock()
	return tail(string(v.logs))
}

// readRSS is this process's VmRSS in bytes.
func readRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

// ---- the parent's side ---------------------------------------------------------

// victim is a running victim process.
type victim struct {
	t        *testing.T
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	lines    chan string
	mu       sync.Mutex // one command at a time
	ID       string     // its peer id
	DataAddr string     // its TCP data address
	stderr   tailBuffer // the last of what it wrote to stderr (it goes to ours too)
}

// startVictim starts a victim process; it is killed at the end of the test.
func startVictim(t *testing.T, spec victimSpec) *victim {
	t.Helper()
	raw, err := json.Marshal(spec)
	if err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	v := &victim{t: t, lines: make(chan string, 16)}
	cmd := exec.Command(self, "-test.run=^$")
	cmd.Env = append(os.Environ(), victimEnv+"="+string(raw))
	cmd.Stderr = io.MultiWriter(os.Stderr, &v.stderr)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL} // never outlives the test binary
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	v.cmd, v.stdin = cmd, stdin
	go func() {
		defer close(v.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			v.lines <- sc.Text()
		}
	}()
	t.Cleanup(v.stop)
	line, err := v.next(30 * time.Second) // a race-built binary starts slowly on a loaded machine
	if err != nil {
		t.Fatalf("victim did not start: %v", err)
	}
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != "ready" {
		t.Fatalf("victim said %q, not ready", line)
	}
	v.ID, v.DataAddr = f[1], f[2]
	return v
}

func (v *victim) next(within time.Duration) (string, error) {
	select {
	case l, ok := <-v.lines:
		if !ok {
			return "", fmt.Errorf("the victim exited (%v)", v.cmd.ProcessState)
		}
		return l, nil
	case <-time.After(within):
		return "", fmt.Errorf("the victim said nothing within %v", within)
	}
}

// ask sends one command and returns its answer.
func (v *victim) ask(cmd string) (string, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if _, err := io.WriteString(v.stdin, cmd+"\n"); err != nil {
		return "", fmt.Errorf("victim gone: %w", err)
	}
	return v.next(15 * time.Second)
}

func (v *victim) stat() (victimStat, error) {
	var s victimStat
	line, err := v.ask("stat")
	if err != nil {
		return s, err
	}
	return s, json.Unmarshal([]byte(line), &s)
}

func (v *victim) reset() error {
	_, err := v.ask("reset")
	return err
}

// dumpLogs has the victim print its node's log tail to stderr.
func (v *victim) dumpLogs() { _, _ = v.ask("logs") }

// tailBuffer keeps the last 16 KiB written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - 16<<10; over > 0 {
		b.buf = b.buf[over:]
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// stop closes the victim's stdin, then kills it if it has not exited
// within 5 s, and reaps it.
func (v *victim) stop() {
	_ = v.stdin.Close()
	done := make(chan struct{})
	go func() { _ = v.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = v.cmd.Process.Kill()
		<-done
	}
}

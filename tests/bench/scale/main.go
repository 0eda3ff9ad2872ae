// Command scale measures the control plane of many peers on one host, in
// one run:
//
//   - lookup latency in an all-to-all mesh of -procs child processes with
//     -peers-per-proc peers each (64 peers in 8 processes by default), and
//     with the same code for 2 peers in 2 processes; the ratio of the p99s;
//   - what a session costs: RSS and open descriptors of one child before and
//     after its peers connect to every other peer, divided by its sessions;
//   - ZMQ contexts per process (libzmq starts one reaper thread per context,
//     named "ZMQbg/Reaper", so they are counted in /proc/self/task).
//
// Every peer is a real node.Open on 127.0.0.1 (ZMQ control, -data-transport)
// with its own memfd region, driven by a small host loop of its own, as an
// engine's scheduler thread drives the tier: every -step (or at once when the
// notification fd wakes it) it serves inbound lookups (HIT, pinned with a job
// id, for the keys it holds, MISS otherwise), collects finished jobs and the
// changed answers (News, TakeAnswers), and, while measuring, keeps one
// request of its own in flight: StartRequest with remote_kv_source at a random
// other peer, LookupMode, one LookupMany of -keys keys (all but one held by
// that peer), and the answers until none is RETRY; then FinishRequest. The
// latency is from StartRequest to the last answer. Before measuring, every
// peer connects to every other (a one-key lookup each way the mesh needs),
// so sessions are not opened while timed.
//
// Children report to the parent in lines on stdout; the parent drives them
// over stdin, and every wait is bounded. The CPU of all processes is printed
// too (while looking up, and for -idle with the mesh connected and nobody
// asking; libzmq's own threads apart): on a small host the figures depend on
// it. Prints, e.g. (2 cores):
//
//	scale: 64 peers / 8 processes: lookup p50 34.87 ms p99 187.11 ms; 2 peers: p50 0.71 ms p99 4.03 ms; p99 ratio 46.46 (goal <= 2)
//	scale: per session: 98.8 KiB RSS, 5.00 fds (one process, 8 peers, 504 sessions: ...)
//	scale: ZMQ contexts per process: [1] with 8 peers each (...)
package main

import (
	"bufio"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/peerkv/peerkv/core/tier"
	"github.com/peerkv/peerkv/tests/bench/internal/benchproc"
)

const (
	childEnv    = "PEERKV_SCALE_PEERS" // set in a child: how many peers it runs
	baseEnv     = "PEERKV_SCALE_BASE"  // the global index of its first peer
	keyLen      = 36
	rowLen      = 4096
	heldKeys    = 64               // keys each peer holds (rows 0..63 of its region)
	setupBound  = 60 * time.Second // starting the peers, connecting the mesh
	lookupBound = 10 * time.Second // one request's answers
	quietBound  = 10 * time.Second // the leak check's settling
	chunk       = 200              // latencies per "lat" line
	retryAfter  = 100 * time.Millisecond
	quietStep   = 100 * time.Millisecond
)

type params struct {
	procs, perProc  int
	keys            int
	duration        time.Duration
	step            time.Duration
	transport       string
	maxPerHost      int
	connectParallel int
	idle            time.Duration
}

func main() {
	var p params
	flag.IntVar(&p.procs, "procs", 8, "child processes of the large mesh")
	flag.IntVar(&p.perProc, "peers-per-proc", 8, "peers in each child of the large mesh")
	flag.IntVar(&p.keys, "keys", 4, "keys per lookup (all but one held by the peer asked)")
	flag.DurationVar(&p.duration, "duration", 8*time.Second, "time each setup keeps looking up")
	flag.DurationVar(&p.step, "step", time.Millisecond, "host loop step (the notification fd wakes it sooner)")
	flag.StringVar(&p.transport, "data-transport", "tcp", "data_transport of every peer")
	flag.IntVar(&p.connectParallel, "connect-parallel", 4, "connects each peer has in flight while the mesh forms")
	flag.DurationVar(&p.idle, "idle", time.Second, "time the connected mesh is left idle (its CPU is measured)")
	flag.IntVar(&p.maxPerHost, "max-peers-per-host", 64,
		"max_peers_per_host of every peer (the default, 32, refuses part of a 64-peer mesh on one address)")
	flag.Parse()
	var err error
	if n := os.Getenv(childEnv); n != "" {
		err = runChild(p, n, os.Getenv(baseEnv))
	} else {
		err = runParent(p)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "scale:", err)
		os.Exit(1)
	}
}

// key is the i-th key peer g holds (i < heldKeys) or does not (i >= heldKeys).
func key(g, i int) []byte {
	h := sha256.Sum256([]byte(fmt.Sprintf("scale/%d/%d", g, i)))
	return append(h[:], 0, 0, 0, 0)
}

// ---------------------------------------------------------------- parent

type mem struct {
	rssKiB, fds, threads, zmqContexts, sessions int
	heapKiB                                     int
}

func (m mem) String() string {
	return fmt.Sprintf("%d %d %d %d %d %d", m.rssKiB, m.fds, m.threads, m.zmqContexts, m.sessions, m.heapKiB)
}

func parseMem(s string) (mem, error) {
	var m mem
	_, err := fmt.Sscanf(s, "%d %d %d %d %d %d", &m.rssKiB, &m.fds, &m.threads, &m.zmqContexts, &m.sessions, &m.heapKiB)
	return m, err
}

// setup is what one mesh measured.
type setup struct {
	peers, procs  int
	lat           []time.Duration
	failed, wrong int
	before, after []mem // per child
	connect       time.Duration
	problems      []string
	// CPU in cores (all processes): the idle connected mesh, and measuring;
	// the part of libzmq's threads.
	idleCores, idleZmq, cores, zmqCores float64
}

func runParent(p params) error {
	begin := time.Now()
	small, err := runSetup(p, 2, 1)
	if err != nil {
		return fmt.Errorf("2 peers: %w", err)
	}
	large, err := runSetup(p, p.procs, p.perProc)
	if err != nil {
		return fmt.Errorf("%d peers: %w", p.procs*p.perProc, err)
	}
	for _, s := range []*setup{small, large} {
		fmt.Printf("scale: %d peers / %d processes: %d lookups of %d keys in %v (%.0f/s; %d failed, %d wrong answers), p50 %s p99 %s max %s; mesh connected in %v (%d at once per peer)\n",
			s.peers, s.procs, len(s.lat), p.keys, p.duration, float64(len(s.lat))/p.duration.Seconds(), s.failed, s.wrong,
			ms(pct(s.lat, 0.50)), ms(pct(s.lat, 0.99)), ms(pct(s.lat, 1)), s.connect.Round(time.Millisecond), p.connectParallel)
		fmt.Printf("scale: %d peers: CPU of all processes: %.2f cores while looking up (libzmq threads %.2f), %.2f idle and connected (libzmq threads %.2f); this host has %d\n",
			s.peers, s.cores, s.zmqCores, s.idleCores, s.idleZmq, runtime.NumCPU())
	}
	p99s, p99l := pct(small.lat, 0.99), pct(large.lat, 0.99)
	fmt.Printf("scale: %d peers / %d processes: lookup p50 %s p99 %s; 2 peers: p50 %s p99 %s; p99 ratio %.2f (goal <= 2)\n",
		large.peers, large.procs, ms(pct(large.lat, 0.5)), ms(p99l), ms(pct(small.lat, 0.5)), ms(p99s),
		float64(p99l)/float64(max(p99s, 1)))

	b, a := large.before[0], large.after[0]
	if n := a.sessions - b.sessions; n > 0 {
		fmt.Printf("scale: per session: %.1f KiB RSS, %.2f fds (one process, %d peers, %d sessions: RSS %.1f -> %.1f MiB, fds %d -> %d, threads %d -> %d, Go heap %.1f -> %.1f MiB)\n",
			float64(a.rssKiB-b.rssKiB)/float64(n), float64(a.fds-b.fds)/float64(n), p.perProc, n,
			float64(b.rssKiB)/1024, float64(a.rssKiB)/1024, b.fds, a.fds, b.threads, a.threads,
			float64(b.heapKiB)/1024, float64(a.heapKiB)/1024)
		var rss, fds []float64
		for i := range large.after {
			d := float64(large.after[i].sessions - large.before[i].sessions)
			rss = append(rss, float64(large.after[i].rssKiB-large.before[i].rssKiB)/d)
			fds = append(fds, float64(large.after[i].fds-large.before[i].fds)/d)
		}
		fmt.Printf("scale: per session, every process: %.1f..%.1f KiB RSS, %.2f..%.2f fds\n",
			slices.Min(rss), slices.Max(rss), slices.Min(fds), slices.Max(fds))
	} else {
		fmt.Println("scale: per session: no sessions opened")
	}
	ctxs := map[int]int{}
	for _, m := range large.after {
		ctxs[m.zmqContexts]++
	}
	fmt.Printf("scale: ZMQ contexts per process: %v with %d peers each (libzmq reaper threads; goal 1): the zmqctl.Transports of a process share one context (sharedContext in core/control/zmqctl/context.go), with four I/O threads and one reaper thread\n",
		slices.Sorted(maps.Keys(ctxs)), p.perProc)
	problems := append(small.problems, large.problems...)
	if len(problems) == 0 {
		fmt.Println("scale: after the run: no requests, jobs, pins or inbound lookups left; no session reopened while measuring")
	}
	for _, pr := range problems {
		fmt.Println("scale: PROBLEM:", pr)
	}
	fmt.Printf("scale: whole run %v\n", time.Since(begin).Round(100*time.Millisecond))
	if len(problems) > 0 || small.failed+large.failed+small.wrong+large.wrong > 0 {
		return errors.New("the run found problems (above)")
	}
	return nil
}

func pct(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[int(q*float64(len(d)-1))]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond)) }

// runSetup runs procs children of per peers each through one measurement.
func runSetup(p params, procs, per int) (*setup, error) {
	s := &setup{peers: procs * per, procs: procs}
	children := make([]*benchproc.Child, 0, procs)
	defer func() { // in parallel: a hung child costs its timeout once
		var wg sync.WaitGroup
		for _, c := range children {
			wg.Add(1)
			go func() { defer wg.Done(); c.Stop() }()
		}
		wg.Wait()
	}()
	for i := range procs {
		c, err := benchproc.Start(setupBound+p.duration+lookupBound,
			fmt.Sprintf("%s=%d", childEnv, per), fmt.Sprintf("%s=%d", baseEnv, i*per))
		if err != nil {
			return nil, err
		}
		children = append(children, c)
	}
	// expect reads child i's next line, which must start with word.
	expect := func(i int, word string) (string, error) {
		line, err := children[i].ReadLine()
		if err != nil {
			return "", fmt.Errorf("child %d: %w", i, err)
		}
		rest, ok := strings.CutPrefix(line, word+" ")
		if !ok {
			return "", fmt.Errorf("child %d said %q, expected %s ...", i, line, word)
		}
		return rest, nil
	}
	var ports []string
	for i := range children {
		rest, err := expect(i, "ready")
		if err != nil {
			return nil, err
		}
		f := strings.Fields(rest)
		if len(f) < per {
			return nil, fmt.Errorf("child %d: bad ready line %q", i, rest)
		}
		m, err := parseMem(strings.Join(f[per:], " "))
		if err != nil {
			return nil, fmt.Errorf("child %d: bad ready line %q: %v", i, rest, err)
		}
		ports = append(ports, f[:per]...)
		s.before = append(s.before, m)
	}
	for _, c := range children {
		if err := c.Println("peers " + strings.Join(ports, " ")); err != nil {
			return nil, err
		}
	}
	for i := range children {
		rest, err := expect(i, "connected")
		if err != nil {
			return nil, err
		}
		f := strings.Fields(rest)
		var idle, idleZmq float64
		if len(f) != 9 {
			return nil, fmt.Errorf("child %d: bad connected line %q", i, rest)
		}
		idle, _ = strconv.ParseFloat(f[6], 64)
		idleZmq, _ = strconv.ParseFloat(f[7], 64)
		us, _ := strconv.ParseInt(f[8], 10, 64)
		s.connect = max(s.connect, time.Duration(us)*time.Microsecond)
		rest = strings.Join(f[:6], " ")
		s.idleCores += idle
		s.idleZmq += idleZmq
		m, err := parseMem(rest)
		if err != nil {
			return nil, fmt.Errorf("child %d: bad connected line %q", i, rest)
		}
		s.after = append(s.after, m)
	}
	for _, c := range children {
		if err := c.Println("go"); err != nil {
			return nil, err
		}
	}
	for i := range children {
		for {
			line, err := children[i].ReadLine()
			if err != nil {
				return nil, fmt.Errorf("child %d: %w", i, err)
			}
			if rest, ok := strings.CutPrefix(line, "lat "); ok {
				for _, f := range strings.Fields(rest) {
					us, err := strconv.ParseInt(f, 10, 64)
					if err != nil {
						return nil, fmt.Errorf("child %d: bad lat line", i)
					}
					s.lat = append(s.lat, time.Duration(us)*time.Microsecond)
				}
				continue
			}
			var failed, wrong int
			var cores, zmqCores float64
			if _, err := fmt.Sscanf(line, "measured %d %d %f %f", &failed, &wrong, &cores, &zmqCores); err != nil {
				return nil, fmt.Errorf("child %d said %q, expected lat or measured", i, line)
			}
			s.failed += failed
			s.wrong += wrong
			s.cores += cores
			s.zmqCores += zmqCores
			break
		}
	}
	slices.Sort(s.lat)
	// Every child has stopped asking: what is left now is left for good.
	for _, c := range children {
		if err := c.Println("check"); err != nil {
			return nil, err
		}
	}
	for i := range children {
		rest, err := expect(i, "end")
		if err != nil {
			return nil, err
		}
		if rest != "ok" {
			s.problems = append(s.problems, fmt.Sprintf("%d peers, child %d: %s", s.peers, i, rest))
		}
	}
	return s, nil
}

// ---------------------------------------------------------------- child

const (
	phaseIdle    int32 = iota
	phaseConnect       // each peer dials the peers after it
	phaseQuiet         // connected, nothing asked: the loop wakes on the fd (or every quietStep)
	phaseMeasure
)

// phases is what the child tells its peers' host loops.
type phases struct {
	phase        atomic.Int32
	connectUntil time.Time // set before phaseConnect
	measureUntil time.Time // set before phaseMeasure
}

// ask is one request of a peer's in flight.
type ask struct {
	req     string
	target  int
	start   time.Time
	keys    [][]byte
	want    []tier.LookupResult
	got     []tier.LookupResult
	left    int // answers still RETRY
	connect bool
}

type peer struct {
	t     *tier.Tier
	g     int
	ports []string // every peer's control port, by global index
	fd    int
	held  map[string]int64
	seen  [tier.NewsKinds]uint64
	jobs  int64
	seq   int
	rng   *rand.Rand
	p     params
	asks  map[string]*ask

	toConnect   map[int]time.Time // targets still to confirm -> next try
	connected   chan struct{}
	measured    chan struct{} // closed when measureDone is set
	measureDone bool
	connErr     string

	// Read by the child after measured is closed.
	lat           []time.Duration
	failed, wrong int

	mu           sync.Mutex // warnings are read by the child while the loop runs
	warnings     []string
	warningCount int
}

func runChild(p params, nStr, baseStr string) error {
	n, err1 := strconv.Atoi(nStr)
	base, err2 := strconv.Atoi(baseStr)
	if err1 != nil || err2 != nil || n < 1 {
		return fmt.Errorf("bad %s/%s: %q %q", childEnv, baseEnv, nStr, baseStr)
	}
	lines := make(chan string, 4)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(os.Stdin)
		sc.Buffer(make([]byte, 1<<16), 1<<20)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	readLine := func(word string, within time.Duration) (string, error) {
		select {
		case line, ok := <-lines:
			if !ok {
				return "", errors.New("stdin closed")
			}
			rest, ok := strings.CutPrefix(line, word)
			if !ok {
				return "", fmt.Errorf("parent said %q, expected %s", line, word)
			}
			return strings.TrimSpace(rest), nil
		case <-time.After(within):
			return "", fmt.Errorf("parent silent for %v", within)
		}
	}

	peers := make([]*peer, n)
	defer shutdownAll(peers)
	for j := range peers {
		pr, err := openPeer(p, base+j)
		if err != nil {
			return fmt.Errorf("peer %d: %w", base+j, err)
		}
		peers[j] = pr
	}
	before := memNow(peers)
	var ports []string
	for _, pr := range peers {
		ports = append(ports, pr.ports[0])
	}
	fmt.Println("ready", strings.Join(ports, " "), before)

	all, err := readLine("peers", setupBound)
	if err != nil {
		return err
	}
	connectStart := time.Now()
	everyone := strings.Fields(all)
	var ph phases
	quit := make(chan struct{})
	var loops sync.WaitGroup
	defer func() { close(quit); loops.Wait() }()
	for _, pr := range peers {
		pr.ports = everyone
		// The lower index dials: each pair needs one session.
		for h := pr.g + 1; h < len(everyone); h++ {
			pr.toConnect[h] = time.Time{}
		}
		loops.Add(1)
		go func() { defer loops.Done(); pr.loop(&ph, quit) }()
	}
	ph.connectUntil = time.Now().Add(setupBound)
	ph.phase.Store(phaseConnect)
	for _, pr := range peers {
		<-pr.connected // bounded by connectUntil in the loop
		if pr.connErr != "" {
			return fmt.Errorf("peer %d: %s", pr.g, pr.connErr)
		}
	}
	// Peers with higher indexes are dialed: wait for their sessions too.
	deadline := time.Now().Add(setupBound)
	for _, pr := range peers {
		for pr.t.Stats().Sessions < len(everyone)-1 {
			if time.Now().After(deadline) {
				return fmt.Errorf("peer %d has %d sessions, not %d, after %v", pr.g, pr.t.Stats().Sessions, len(everyone)-1, setupBound)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	ph.phase.Store(phaseQuiet)
	connectTime := time.Since(connectStart)
	time.Sleep(200 * time.Millisecond) // the handshakes' stragglers settle
	opened := 0
	for _, pr := range peers {
		opened += int(pr.t.Stats().SessionsOpened)
	}
	after := memNow(peers)
	// The connected mesh's own CPU: nobody asks, hosts wake only when told.
	cpu0, t0 := cpuNow(), time.Now()
	time.Sleep(p.idle)
	idle := cpuNow().since(cpu0, time.Since(t0))
	fmt.Println("connected", after, idle, connectTime.Microseconds())

	if _, err := readLine("go", setupBound); err != nil {
		return err
	}
	ph.measureUntil = time.Now().Add(p.duration)
	cpu0, t0 = cpuNow(), time.Now()
	ph.phase.Store(phaseMeasure)
	failed, wrong := 0, 0
	for _, pr := range peers {
		select {
		case <-pr.measured:
		case <-time.After(p.duration + 2*lookupBound):
			return fmt.Errorf("peer %d did not finish measuring (its host loop is stuck):\n%s", pr.g, stacks())
		}
		for i := 0; i < len(pr.lat); i += chunk {
			var b strings.Builder
			b.WriteString("lat")
			for _, d := range pr.lat[i:min(i+chunk, len(pr.lat))] {
				fmt.Fprintf(&b, " %d", d.Microseconds())
			}
			fmt.Println(b.String())
		}
		failed += pr.failed
		wrong += pr.wrong
	}
	fmt.Println("measured", failed, wrong, cpuNow().since(cpu0, time.Since(t0)))

	if _, err := readLine("check", setupBound); err != nil {
		return err
	}
	left := leftovers(peers, opened)
	deadline = time.Now().Add(quietBound)
	for left != "" && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		left = leftovers(peers, opened)
	}
	var problems []string
	if left != "" {
		problems = append(problems, "after "+quietBound.String()+": "+left)
	}
	for _, pr := range peers {
		pr.mu.Lock()
		if pr.warningCount > 0 {
			problems = append(problems, fmt.Sprintf("peer %d: %d warnings or errors, first: %s",
				pr.g, pr.warningCount, strings.Join(pr.warnings, " | ")))
		}
		pr.mu.Unlock()
	}
	if len(problems) == 0 {
		fmt.Println("end ok")
	} else {
		fmt.Println("end", strings.Join(problems, "; "))
	}
	_, _ = readLine("", setupBound) // until the parent closes stdin
	return nil
}

// leftovers describes what the peers still hold ("" when nothing): the
// leak check once nobody asks any more.
func leftovers(peers []*peer, opened int) string {
	var out []string
	nowOpened := 0
	for _, pr := range peers {
		st := pr.t.Stats()
		nowOpened += int(st.SessionsOpened)
		if st.Requests+st.JobsInFlight+st.JobsUnreported+st.InboundQueued+st.InboundActive+st.ServeKVIDs+st.ServeKeysWanted > 0 {
			out = append(out, fmt.Sprintf("peer %d: %d requests, %d jobs in flight, %d unreported, %d inbound queued, %d active, %d serve kv ids, %d keys wanted",
				pr.g, st.Requests, st.JobsInFlight, st.JobsUnreported, st.InboundQueued, st.InboundActive, st.ServeKVIDs, st.ServeKeysWanted))
		}
		if st.Poisoned != "" {
			out = append(out, fmt.Sprintf("peer %d poisoned: %s", pr.g, st.Poisoned))
		}
	}
	if nowOpened != opened {
		out = append(out, fmt.Sprintf("%d sessions opened while measuring (the mesh was complete before)", nowOpened-opened))
	}
	return strings.Join(out, "; ")
}

func openPeer(p params, g int) (*peer, error) {
	region, err := benchproc.Region("peerkv-scale", 2*heldKeys, rowLen)
	if err != nil {
		return nil, err
	}
	t, err := benchproc.Open(region, func(port int) string {
		return fmt.Sprintf(`{"host":"127.0.0.1","port":%d,"data_transport":%q,"key_len":%d,"hash_seed":"bench","max_peers_per_host":%d}`,
			port, p.transport, keyLen, p.maxPerHost)
	})
	if err != nil {
		return nil, err
	}
	fd, err := t.NotifyFD()
	if err != nil {
		_ = t.Shutdown()
		return nil, err
	}
	pr := &peer{t: t, g: g, fd: fd, p: p, held: map[string]int64{}, asks: map[string]*ask{},
		rng:       rand.New(rand.NewPCG(uint64(g), uint64(time.Now().UnixNano()))),
		toConnect: map[int]time.Time{}, connected: make(chan struct{}), measured: make(chan struct{})}
	id := t.LocalID()
	pr.ports = []string{id[strings.LastIndexByte(id, ':')+1:]}
	for i := range heldKeys {
		pr.held[string(key(g, i))] = int64(i)
	}
	return pr, nil
}

// shutdownAll stops every peer at once, bounded.
func shutdownAll(peers []*peer) {
	done := make(chan struct{})
	go func() {
		var wg sync.WaitGroup
		for _, pr := range peers {
			if pr == nil {
				continue
			}
			wg.Add(1)
			go func() { defer wg.Done(); _ = pr.t.Shutdown(); _ = pr.t.CloseNotify() }()
		}
		wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(quietBound):
		fmt.Fprintf(os.Stderr, "scale: child %d: Shutdown of its peers did not return within %v\n", os.Getpid(), quietBound)
		os.Exit(1)
	}
}

// loop is the peer's host: one goroutine, as an engine's scheduler thread.
func (pr *peer) loop(ph *phases, quit <-chan struct{}) {
	buf := make([]byte, 8)
	stepMs := max(1, int(pr.p.step/time.Millisecond))
	quietMs := int(quietStep / time.Millisecond)
	for {
		select {
		case <-quit:
			return
		default:
		}
		fds := []unix.PollFd{{Fd: int32(pr.fd), Events: unix.POLLIN}}
		wait := stepMs
		if ph.phase.Load() == phaseQuiet && len(pr.asks) == 0 {
			wait = quietMs
		}
		if n, _ := unix.Poll(fds, wait); n > 0 {
			_, _ = unix.Read(pr.fd, buf)
		}
		pr.collect()
		pr.drive(ph)
	}
}

// moved reports whether news count k changed since the last look.
func (pr *peer) moved(k tier.NewsKind) bool {
	n := pr.t.News(k)
	if n == pr.seen[k] {
		return false
	}
	pr.seen[k] = n
	return true
}

// collect serves inbound lookups and collects results, answers and logs,
// each only when its news count moved.
func (pr *peer) collect() {
	if pr.moved(tier.NewsInbound) {
		pr.serve()
	}
	if pr.moved(tier.NewsResults) {
		for pr.t.GetFinished(1024) != nil {
		}
	}
	if pr.moved(tier.NewsAnswers) {
		for _, c := range pr.t.TakeAnswers(func(tier.AnswerChange) bool { return true }) {
			a := pr.asks[c.ReqID]
			if a == nil {
				continue
			}
			if c.Failed {
				for i := range a.got {
					a.got[i] = tier.Miss
				}
				a.left = 0
			}
			for i, pos := range c.Positions {
				if int(pos) < len(a.got) && a.got[pos] == tier.Retry && c.Results[i] != tier.Retry {
					a.left--
				}
				if int(pos) < len(a.got) {
					a.got[pos] = c.Results[i]
				}
			}
			if a.left == 0 {
				pr.done(a, c.Failed)
			}
		}
	}
	if pr.moved(tier.NewsLogs) {
		for _, line := range strings.Split(string(pr.t.TakeLogs(1<<16)), "\n") {
			if strings.HasPrefix(line, "WARNING") || strings.HasPrefix(line, "ERROR") {
				pr.note(line)
			}
		}
	}
}

// serve answers every inbound lookup: HIT (pinned) for the keys held.
func (pr *peer) serve() {
	held := func(k []byte, _ int) (int64, bool) {
		row, ok := pr.held[string(k)]
		return row, ok
	}
	if err := benchproc.ServeInbound(pr.t, held, &pr.jobs); err != nil {
		pr.note("AnswerInbound: " + err.Error())
	}
}

func (pr *peer) note(s string) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	pr.warningCount++
	if len(pr.warnings) < 3 {
		pr.warnings = append(pr.warnings, s)
	}
}

// drive starts the requests of the current phase and ends overdue ones.
func (pr *peer) drive(ph *phases) {
	now := time.Now()
	for _, a := range pr.asks {
		if now.Sub(a.start) > lookupBound {
			pr.note(fmt.Sprintf("request %s to peer %d: no answer within %v", a.req, a.target, lookupBound))
			pr.done(a, true)
		}
	}
	switch ph.phase.Load() {
	case phaseConnect:
		if pr.toConnect == nil {
			return
		}
		var batch []*ask
		for h, next := range pr.toConnect {
			if len(pr.asks)+len(batch) >= pr.p.connectParallel {
				break
			}
			if now.Before(next) {
				continue
			}
			pr.toConnect[h] = now.Add(lookupBound + time.Second) // until its answer comes
			if a := pr.start(h, []int{pr.rng.IntN(heldKeys)}, true); a != nil {
				batch = append(batch, a)
			}
		}
		pr.lookup(batch)
		if len(pr.toConnect) == 0 || now.After(ph.connectUntil) {
			if len(pr.toConnect) > 0 {
				pr.connErr = fmt.Sprintf("%d peers not connected within %v", len(pr.toConnect), setupBound)
			}
			pr.toConnect = nil
			close(pr.connected)
		}
	case phaseMeasure:
		if len(pr.asks) > 0 || pr.measureDone {
			return
		}
		if now.After(ph.measureUntil) {
			pr.measureDone = true
			close(pr.measured)
			return
		}
		h := pr.rng.IntN(len(pr.ports) - 1)
		if h >= pr.g {
			h++
		}
		// Distinct keys: a repeated key shares its first position.
		idx := pr.rng.Perm(heldKeys)[:min(pr.p.keys-1, heldKeys)]
		idx = append(idx, heldKeys+pr.rng.IntN(1<<20)) // not held: MISS
		if a := pr.start(h, idx, false); a != nil {
			pr.lookup([]*ask{a})
		}
	}
}

// start starts a request pulling from peer h, asking key(h, i) for idx.
func (pr *peer) start(h int, idx []int, connect bool) *ask {
	pr.seq++
	a := &ask{req: fmt.Sprintf("p%d-%d", pr.g, pr.seq), target: h, start: time.Now(), connect: connect}
	params := fmt.Sprintf(`{"remote_kv_source":{"kv_request_id":%q,"remote_host":"127.0.0.1","remote_port":%s}}`, a.req, pr.ports[h])
	if _, err := pr.t.StartRequest(a.req, []byte(params)); err != nil {
		pr.note("StartRequest: " + err.Error())
		pr.failed++
		return nil
	}
	if mode := pr.t.LookupMode(a.req); mode != tier.LookupsAsk {
		pr.note(fmt.Sprintf("request %s: lookup mode %d, not ask", a.req, mode))
		pr.failed++
		_ = pr.t.FinishRequest(a.req)
		return nil
	}
	for _, i := range idx {
		a.keys = append(a.keys, key(h, i))
		if i < heldKeys {
			a.want = append(a.want, tier.Hit)
		} else {
			a.want = append(a.want, tier.Miss)
		}
	}
	a.got = make([]tier.LookupResult, len(idx))
	pr.asks[a.req] = a
	return a
}

// lookup sends the keys of the asks in one LookupMany, as the Python tier
// does once per step.
func (pr *peer) lookup(batch []*ask) {
	if len(batch) == 0 {
		return
	}
	var rk []tier.RequestKeys
	n := 0
	for _, a := range batch {
		rk = append(rk, tier.RequestKeys{ReqID: a.req, Keys: a.keys})
		n += len(a.keys)
	}
	out := make([]tier.LookupResult, n)
	if err := pr.t.LookupMany(rk, out); err != nil {
		pr.note("LookupMany: " + err.Error())
		for _, a := range batch {
			pr.done(a, true)
		}
		return
	}
	for _, a := range batch {
		copy(a.got, out[:len(a.got)])
		out = out[len(a.got):]
		for _, r := range a.got {
			if r == tier.Retry {
				a.left++
			}
		}
		if a.left == 0 {
			pr.done(a, false)
		}
	}
}

// done ends an ask: its latency (unless it failed), its check, its request.
func (pr *peer) done(a *ask, failed bool) {
	delete(pr.asks, a.req)
	_ = pr.t.FinishRequest(a.req)
	if a.connect {
		if !failed && a.got[0] == tier.Hit {
			delete(pr.toConnect, a.target)
		} else if pr.toConnect != nil {
			pr.toConnect[a.target] = time.Now().Add(retryAfter)
		}
		return
	}
	switch {
	case failed:
		pr.failed++
	case !slices.Equal(a.got, a.want):
		pr.wrong++
		pr.note(fmt.Sprintf("request %s to peer %d: answers %v, expected %v", a.req, a.target, a.got, a.want))
	default:
		pr.lat = append(pr.lat, time.Since(a.start))
	}
}

// memNow is this process's figures, with the sessions of its peers.
func memNow(peers []*peer) mem {
	var m mem
	if status, err := os.ReadFile("/proc/self/status"); err == nil {
		for _, line := range strings.Split(string(status), "\n") {
			if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
				m.rssKiB, _ = strconv.Atoi(strings.TrimSuffix(strings.TrimSpace(rest), " kB"))
			}
		}
	}
	if fds, err := os.ReadDir("/proc/self/fd"); err == nil {
		m.fds = len(fds)
	}
	tasks, _ := os.ReadDir("/proc/self/task")
	m.threads = len(tasks)
	for _, task := range tasks {
		comm, err := os.ReadFile("/proc/self/task/" + task.Name() + "/comm")
		if err == nil && strings.TrimSpace(string(comm)) == "ZMQbg/Reaper" {
			m.zmqContexts++
		}
	}
	for _, pr := range peers {
		m.sessions += pr.t.Stats().Sessions
	}
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	m.heapKiB = int(ms.HeapInuse >> 10)
	return m
}

// stacks is every goroutine's stack, for a wait that ran out.
func stacks() []byte {
	buf := make([]byte, 1<<20)
	return buf[:runtime.Stack(buf, true)]
}

// cpu is this process's CPU time: all of it (getrusage), and the part of
// libzmq's own threads (named ZMQbg/...), in USER_HZ ticks.
type cpu struct {
	total   time.Duration
	zmqTick int64
}

func cpuNow() cpu {
	var c cpu
	total, threads, err := benchproc.CPU()
	if err != nil {
		return c
	}
	c.total = total
	for _, th := range threads {
		if strings.HasPrefix(th.Name, "ZMQbg") {
			c.zmqTick += th.Ticks
		}
	}
	return c
}

// since is "<cores> <zmq cores>": CPU used since c0 over wall, in cores.
func (c cpu) since(c0 cpu, wall time.Duration) string {
	return fmt.Sprintf("%.3f %.3f", (c.total-c0.total).Seconds()/wall.Seconds(),
		float64(c.zmqTick-c0.zmqTick)/benchproc.UserHZ/wall.Seconds())
}

// Command scale measures the control plane of many peers on one host, in
// one run:
//
//   - lookup latency in an all-to-all mesh of -procs child processes with
//     -peers-per-proc peers each (64 peers in 8 processes by default), and
//     with the same code for 2 peers in 2 processes, in two rounds: paced
//     (requests start at -rate per second in all, Poisson, whatever is in
//     flight: the same load for both meshes, so the ratio of the p99s shows
//     what more peers cost; each latency counts from when its request was
//     due) and closed (every peer keeps one request in flight: 32 times
//     the requests in flight of 2 peers, so on a small host the latency is
//     what Little's law makes of the CPU, printed as such);
//   - the CPU of all processes a lookup, above what the idle mesh uses;
//   - what a session costs: RSS and open descriptors of one child before and
//     after its peers connect to every other peer, divided by its sessions;
//   - ZMQ contexts per process (libzmq starts one reaper thread per context,
//     named "ZMQbg/Reaper", so they are counted in /proc/self/task).
//
// Every peer is a real node.Open on 127.0.0.1 (ZMQ control, -data-transport)
// with its own memfd region, driven by a small host loop of its own, as an
// engine's scheduler thread drives the tier: every -step while a request of
// its waits (or at once when the notification fd wakes it) it serves inbound
// lookups (HIT, pinned with a job id, for the keys it holds, MISS
// otherwise), collects finished jobs and the changed answers (News,
// TakeAnswers), and starts the requests the round calls for: StartRequest
// with remote_kv_source at a random other peer, LookupMode, one LookupMany
// of -keys keys (all but one held by that peer), and the answers until none
// is RETRY; then FinishRequest. The latency is from StartRequest to the last
// answer. Before measuring, every peer connects to every other (a one-key
// lookup each way the mesh needs), so sessions are not opened while timed.
//
// Children report to the parent in lines on stdout; the parent drives them
// over stdin, and every wait is bounded. The CPU of all processes is printed
// too (while looking up, and for -idle with the mesh connected and nobody
// asking; libzmq's own threads apart): on a small host the figures depend on
// it. Prints, e.g. (2 cores):
//
//	scale: 64 peers / 8 processes at the same load as 2 peers (1000 lookups/s in all): lookup p50 1.15 ms p99 3.02 ms; 2 peers: p50 0.76 ms p99 1.62 ms; p99 ratio 1.86 (goal <= 2)
//	scale: CPU a lookup at that load, above the idle mesh's: 712 µs with 64 peers, 470 µs with 2 (ratio 1.51; ...)
//	scale: saturated (one request in flight per peer): 64 peers p99 28.07 ms, 2 peers p99 0.85 ms (ratio 32.99): ...
//	scale: CPU a lookup when saturated, above the idle mesh's: 180 µs with 64 peers, 198 µs with 2 (ratio 0.91; ...)
//	scale: per session: 98.8 KiB RSS, 5.00 fds (one process, 8 peers, 504 sessions: ...)
//	scale: ZMQ contexts per process: [1] with 8 peers each (...)
package main

import (
	"bufio"
	"bytes"
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
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/peerkv/peerkv/core/tier"
	"github.com/peerkv/peerkv/tests/bench/internal/benchproc"
	"github.com/peerkv/peerkv/tests/hostsim"
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
	rate            float64
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
	flag.DurationVar(&p.idle, "idle", 4*time.Second, "time the connected mesh is left idle (its CPU is measured; two ZMTP heartbeat intervals)")
	flag.Float64Var(&p.rate, "rate", 1000, "lookups/s of the whole mesh in the paced round, the same for every mesh")
	flag.IntVar(&p.maxPerHost, "max-peers-per-host", 64,
		"max_peers_per_host of every peer (the default, 32, refuses part of a 64-peer mesh on one address)")
	flag.Parse()
	if !(p.rate > 0) || p.procs < 1 || p.perProc < 1 {
		fmt.Fprintln(os.Stderr, "scale: -rate, -procs and -peers-per-proc must be positive")
		os.Exit(2)
	}
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

// The two rounds every mesh runs.
const (
	closedLoop = "closed" // every peer keeps one request in flight
	paced      = "paced"  // requests start at -rate per second in all, whatever is in flight
)

var roundModes = []string{closedLoop, paced}

// round is what one round of lookups measured in a mesh.
type round struct {
	lat           []time.Duration
	failed, wrong int
	wall          time.Duration // the longest child's, until its last peer finished
	// CPU seconds of all processes over the round, and of libzmq's threads.
	cpu, zmqCPU float64
}

func (r *round) rate() float64 { return float64(len(r.lat)) / max(r.wall.Seconds(), 1e-9) }

// cores is the CPU of all processes over the round, in cores.
func (r *round) cores() (all, zmq float64) {
	w := max(r.wall.Seconds(), 1e-9)
	return r.cpu / w, r.zmqCPU / w
}

// cpuPerLookup is the CPU of all processes per lookup, and the same above
// what the idle mesh would have used anyway (heartbeats, host loops), in µs.
func (r *round) cpuPerLookup(idleCores float64) (all, aboveIdle float64) {
	n := float64(max(len(r.lat), 1))
	return r.cpu / n * 1e6, max(r.cpu-idleCores*r.wall.Seconds(), 0) / n * 1e6
}

// setup is what one mesh measured.
type setup struct {
	peers, procs  int
	rounds        map[string]*round
	before, after []mem // per child
	connect       time.Duration
	problems      []string
	// CPU in cores (all processes) of the idle connected mesh; the part of
	// libzmq's threads.
	idleCores, idleZmq float64
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
	failed := 0
	for _, s := range []*setup{small, large} {
		fmt.Printf("scale: %d peers / %d processes: mesh connected in %v (%d at once per peer); idle and connected, all processes use %.2f cores (libzmq threads %.2f); this host has %d\n",
			s.peers, s.procs, s.connect.Round(time.Millisecond), p.connectParallel, s.idleCores, s.idleZmq, runtime.NumCPU())
		for _, mode := range roundModes {
			r := s.rounds[mode]
			all, above := r.cpuPerLookup(s.idleCores)
			cores, zmqCores := r.cores()
			fmt.Printf("scale: %d peers, %s: %d lookups of %d keys in %v (%.0f/s; %d failed, %d wrong answers), p50 %s p99 %s max %s; CPU %.2f cores (libzmq threads %.2f), %.0f µs a lookup (%.0f above the idle mesh's)\n",
				s.peers, mode, len(r.lat), p.keys, r.wall.Round(time.Millisecond), r.rate(), r.failed, r.wrong,
				ms(pct(r.lat, 0.50)), ms(pct(r.lat, 0.99)), ms(pct(r.lat, 1)), cores, zmqCores, all, above)
			failed += r.failed + r.wrong
		}
	}
	sp, lp := small.rounds[paced], large.rounds[paced]
	fmt.Printf("scale: %d peers / %d processes at the same load as 2 peers (%.0f lookups/s in all): lookup p50 %s p99 %s; 2 peers: p50 %s p99 %s; p99 ratio %.2f (goal <= 2)\n",
		large.peers, large.procs, p.rate, ms(pct(lp.lat, 0.5)), ms(pct(lp.lat, 0.99)), ms(pct(sp.lat, 0.5)), ms(pct(sp.lat, 0.99)),
		float64(pct(lp.lat, 0.99))/float64(max(pct(sp.lat, 0.99), 1)))
	_, sAbove := sp.cpuPerLookup(small.idleCores)
	_, lAbove := lp.cpuPerLookup(large.idleCores)
	fmt.Printf("scale: CPU a lookup at that load, above the idle mesh's: %.0f µs with %d peers, %.0f µs with %d (ratio %.2f; the cost of a message does not grow with the peers when it is near 1)\n",
		lAbove, large.peers, sAbove, small.peers, lAbove/max(sAbove, 1e-9))
	sc, lc := small.rounds[closedLoop], large.rounds[closedLoop]
	fmt.Printf("scale: saturated (one request in flight per peer): %d peers p99 %s, 2 peers p99 %s (ratio %.2f): %d requests always in flight at %.0f/s wait %.1f ms each on average (Little's law), whatever the number of peers\n",
		large.peers, ms(pct(lc.lat, 0.99)), ms(pct(sc.lat, 0.99)), float64(pct(lc.lat, 0.99))/float64(max(pct(sc.lat, 0.99), 1)),
		large.peers, lc.rate(), float64(large.peers)/max(lc.rate(), 1e-9)*1e3)
	_, sAbove = sc.cpuPerLookup(small.idleCores)
	_, lAbove = lc.cpuPerLookup(large.idleCores)
	fmt.Printf("scale: CPU a lookup when saturated, above the idle mesh's: %.0f µs with %d peers, %.0f µs with %d (ratio %.2f; paced, each lookup also pays for waking idle threads)\n",
		lAbove, large.peers, sAbove, small.peers, lAbove/max(sAbove, 1e-9))

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
	if len(problems) > 0 || failed > 0 {
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
	s := &setup{peers: procs * per, procs: procs, rounds: map[string]*round{}}
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
		c, err := benchproc.Start(setupBound+time.Duration(len(roundModes))*(p.duration+lookupBound),
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
			return "", fmt.Errorf("child %d said %q, expected %q and its value", i, line, word)
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
	for _, mode := range roundModes {
		r, err := runRound(children, mode, p.rate/float64(s.peers))
		if err != nil {
			return nil, fmt.Errorf("%s round: %w", mode, err)
		}
		s.rounds[mode] = r
	}
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

// runRound has every child look up in mode (perPeer: the requests a peer
// starts a second when paced) and collects what they measured.
func runRound(children []*benchproc.Child, mode string, perPeer float64) (*round, error) {
	for _, c := range children {
		if err := c.Println(fmt.Sprintf("go %s %g", mode, perPeer)); err != nil {
			return nil, err
		}
	}
	r := &round{}
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
					r.lat = append(r.lat, time.Duration(us)*time.Microsecond)
				}
				continue
			}
			var failed, wrong int
			var cpu, zmqCPU float64
			var wallUs int64
			if _, err := fmt.Sscanf(line, "measured %d %d %f %f %d", &failed, &wrong, &cpu, &zmqCPU, &wallUs); err != nil {
				return nil, fmt.Errorf("child %d said %q, expected lat or measured", i, line)
			}
			r.failed += failed
			r.wrong += wrong
			r.cpu += cpu
			r.zmqCPU += zmqCPU
			r.wall = max(r.wall, time.Duration(wallUs)*time.Microsecond)
			break
		}
	}
	slices.Sort(r.lat)
	return r, nil
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
	connectUntil time.Time            // set before phaseConnect
	plan         atomic.Pointer[plan] // stored before phaseMeasure
}

// plan is one round of lookups: how its peers start requests, until when,
// and where each peer's host loop puts what it measured.
type plan struct {
	paced   bool
	perPeer float64 // requests a peer starts a second, when paced
	until   time.Time
	results []*result // by the peer's index in its child
}

// result is what one peer measured in a round: written by its host loop
// only, read by the child after done is closed.
type result struct {
	lat           []time.Duration
	failed, wrong int
	done          chan struct{}
	finished      bool // done is closed (the loop's own flag)
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

// node is one of this process's nodes and its host; the others in the
// mesh are its peers.
type node struct {
	t     *tier.Tier
	g     int
	ports []string // every peer's control port, by global index
	held  map[string]int64
	seen  [tier.NewsKinds]uint64
	jobs  int64
	seq   int
	rng   *rand.Rand
	p     params
	asks  map[string]*ask

	toConnect map[int]time.Time // targets still to confirm -> next try
	connected chan struct{}
	connErr   string

	notify     *os.File // a pollable copy of fd, for the host loop's waits
	notifyConn syscall.RawConn

	j         int     // index in its child, in plan.results
	plan      *plan   // the round the loop is in
	res       *result // where latencies and failures go (a dummy while connecting)
	nextStart time.Time

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

	peers := make([]*node, n)
	defer shutdownAll(peers)
	for j := range peers {
		pr, err := openNode(p, base+j)
		if err != nil {
			return fmt.Errorf("peer %d: %w", base+j, err)
		}
		pr.j = j
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

	for range roundModes {
		if err := measureRound(peers, &ph, p.duration, readLine); err != nil {
			return err
		}
	}

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

// measureRound runs the round the parent's "go MODE PER-PEER-RATE" names and
// reports its latencies, failures and CPU.
func measureRound(peers []*node, ph *phases, duration time.Duration, readLine func(string, time.Duration) (string, error)) error {
	rest, err := readLine("go", setupBound)
	if err != nil {
		return err
	}
	var mode string
	var perPeer float64
	if _, err := fmt.Sscanf(rest, "%s %g", &mode, &perPeer); err != nil || (mode != closedLoop && mode != paced) {
		return fmt.Errorf("bad go line %q", rest)
	}
	pl := &plan{paced: mode == paced, perPeer: perPeer, until: time.Now().Add(duration)}
	for range peers {
		pl.results = append(pl.results, &result{done: make(chan struct{})})
	}
	cpu0, t0 := cpuNow(), time.Now()
	ph.plan.Store(pl)
	ph.phase.Store(phaseMeasure)
	for j, pr := range peers {
		select {
		case <-pl.results[j].done:
		case <-time.After(duration + 2*lookupBound):
			return fmt.Errorf("peer %d did not finish measuring (its host loop is stuck):\n%s", pr.g, stacks())
		}
	}
	// Measured before printing: writing the latencies is not the round's.
	wall := time.Since(t0)
	cpu, zmqCPU := cpuNow().seconds(cpu0)
	failed, wrong := 0, 0
	for _, r := range pl.results {
		for i := 0; i < len(r.lat); i += chunk {
			var b strings.Builder
			b.WriteString("lat")
			for _, d := range r.lat[i:min(i+chunk, len(r.lat))] {
				fmt.Fprintf(&b, " %d", d.Microseconds())
			}
			fmt.Println(b.String())
		}
		failed += r.failed
		wrong += r.wrong
	}
	fmt.Println("measured", failed, wrong, cpu, zmqCPU, wall.Microseconds())
	return nil
}

// leftovers describes what the peers still hold ("" when nothing): the
// leak check once nobody asks any more.
func leftovers(peers []*node, opened int) string {
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

func openNode(p params, g int) (*node, error) {
	region, err := benchproc.Region("peerkv-scale", 2*heldKeys, rowLen)
	if err != nil {
		return nil, err
	}
	t, err := benchproc.Open(region, func(port int) string {
		return fmt.Sprintf(`{"host":"127.0.0.1","port":%d,"data_port":0,"data_transport":%q,"key_len":%d,"hash_seed":"bench","max_peers_per_host":%d}`,
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
	notify, err := pollable(fd)
	if err != nil {
		_ = t.Shutdown()
		return nil, fmt.Errorf("notification fd: %w", err)
	}
	notifyConn, err := notify.SyscallConn()
	if err != nil {
		notify.Close()
		_ = t.Shutdown()
		return nil, fmt.Errorf("notification fd: %w", err)
	}
	pr := &node{t: t, g: g, notify: notify, notifyConn: notifyConn, p: p, held: map[string]int64{}, asks: map[string]*ask{},
		rng:       rand.New(rand.NewPCG(uint64(g), uint64(time.Now().UnixNano()))),
		toConnect: map[int]time.Time{}, connected: make(chan struct{}), res: &result{}}
	id := t.LocalID()
	pr.ports = []string{id[strings.LastIndexByte(id, ':')+1:]}
	for i := range heldKeys {
		pr.held[string(key(g, i))] = int64(i)
	}
	return pr, nil
}

// shutdownAll stops every peer at once, bounded.
func shutdownAll(peers []*node) {
	done := make(chan struct{})
	go func() {
		var wg sync.WaitGroup
		for _, pr := range peers {
			if pr == nil {
				continue
			}
			wg.Add(1)
			go func() { defer wg.Done(); pr.notify.Close(); _ = pr.t.Shutdown(); _ = pr.t.CloseNotify() }()
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

// loop is the node's host: one goroutine, as an engine's scheduler thread.
//
// It waits for the notification fd in Go's poller, not in poll(2): an
// engine's scheduler thread waits outside Go, holding none of the process's
// Ps, while a goroutine blocked in a syscall holds one, and 8 of them in a
// process of 2 Ps would starve the peers' own goroutines.
func (pr *node) loop(ph *phases, quit <-chan struct{}) {
	buf := make([]byte, 8)
	drain := func(fd uintptr) bool {
		_, err := unix.Read(int(fd), buf)
		return err != unix.EAGAIN
	}
	for {
		select {
		case <-quit:
			return
		default:
		}
		phase := ph.phase.Load()
		pl := pr.plan
		pacing := phase == phaseMeasure && pl != nil && pl.paced && !pr.res.finished
		wait := pr.p.step
		if len(pr.asks) == 0 && (phase == phaseQuiet || pacing) {
			wait = quietStep
		}
		if pacing { // wake for the next start, on time
			wait = min(wait, max(0, time.Until(pr.nextStart)))
		}
		if wait > 0 {
			_ = pr.notify.SetReadDeadline(time.Now().Add(wait))
			_ = pr.notifyConn.Read(drain) // a deadline's error is the step
		}
		pr.collect()
		pr.drive(ph)
	}
}

// pollable is a copy of the non-blocking fd that Go's poller watches.
func pollable(fd int) (*os.File, error) {
	dup, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("dup: %w", err)
	}
	f := os.NewFile(uintptr(dup), "notify")
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		f.Close()
		return nil, fmt.Errorf("not pollable: %w", err)
	}
	return f, nil
}

// moved reports whether news count k changed since the last look.
func (pr *node) moved(k tier.NewsKind) bool {
	n := pr.t.News(k)
	if n == pr.seen[k] {
		return false
	}
	pr.seen[k] = n
	return true
}

// collect serves inbound lookups and collects results, answers and logs,
// each only when its news count moved.
func (pr *node) collect() {
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
func (pr *node) serve() {
	if _, err := hostsim.Serve(pr.t, hostsim.Rows(pr.held), hostsim.Count(&pr.jobs)); err != nil {
		pr.note("AnswerInbound: " + err.Error())
	}
}

func (pr *node) note(s string) {
	pr.mu.Lock()
	defer pr.mu.Unlock()
	pr.warningCount++
	if len(pr.warnings) < 3 {
		pr.warnings = append(pr.warnings, s)
	}
}

// drive starts the requests of the current phase and ends overdue ones.
func (pr *node) drive(ph *phases) {
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
		pr.measure(ph.plan.Load(), now)
	}
}

// measure starts the requests of round pl that are due and ends the round
// once its time is up and nothing is in flight.
func (pr *node) measure(pl *plan, now time.Time) {
	if pl != pr.plan { // a new round: arrivals from now on, no burst at its start
		pr.plan, pr.res = pl, pl.results[pr.j]
		pr.nextStart = now.Add(pr.interarrival(pl))
	}
	if pr.res.finished {
		return
	}
	if now.After(pl.until) {
		if len(pr.asks) == 0 {
			pr.res.finished = true
			close(pr.res.done)
		}
		return
	}
	var batch []*ask
	switch {
	case !pl.paced && len(pr.asks) == 0:
		batch = append(batch, pr.startRandom())
	case pl.paced:
		// Poisson arrivals; a loop that fell behind starts what is due at
		// once, each timed from when it was due, so a slow host shows as
		// latency, not as fewer or faster requests.
		for !now.Before(pr.nextStart) {
			if a := pr.startRandom(); a != nil {
				a.start = pr.nextStart
				batch = append(batch, a)
			}
			pr.nextStart = pr.nextStart.Add(pr.interarrival(pl))
		}
	}
	pr.lookup(slices.DeleteFunc(batch, func(a *ask) bool { return a == nil }))
}

// interarrival is the time to a paced peer's next request.
func (pr *node) interarrival(pl *plan) time.Duration {
	return time.Duration(pr.rng.ExpFloat64() / pl.perPeer * float64(time.Second))
}

// startRandom starts a request at a random other peer: keys-1 keys it
// holds and one it does not.
func (pr *node) startRandom() *ask {
	h := pr.rng.IntN(len(pr.ports) - 1)
	if h >= pr.g {
		h++
	}
	// Distinct keys: a repeated key shares its first position.
	idx := pr.rng.Perm(heldKeys)[:min(pr.p.keys-1, heldKeys)]
	idx = append(idx, heldKeys+pr.rng.IntN(1<<20)) // not held: MISS
	return pr.start(h, idx, false)
}

// start starts a request pulling from peer h, asking key(h, i) for idx.
func (pr *node) start(h int, idx []int, connect bool) *ask {
	pr.seq++
	a := &ask{req: fmt.Sprintf("p%d-%d", pr.g, pr.seq), target: h, start: time.Now(), connect: connect}
	params := fmt.Sprintf(`{"remote_kv_source":{"kv_request_id":%q,"remote_host":"127.0.0.1","remote_port":%s}}`, a.req, pr.ports[h])
	if _, err := pr.t.StartRequest(a.req, []byte(params)); err != nil {
		pr.note("StartRequest: " + err.Error())
		pr.res.failed++
		return nil
	}
	if mode := pr.t.LookupMode(a.req); mode != tier.LookupsAsk {
		pr.note(fmt.Sprintf("request %s: lookup mode %d, not ask", a.req, mode))
		pr.res.failed++
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
func (pr *node) lookup(batch []*ask) {
	if len(batch) == 0 {
		return
	}
	var rk []tier.RequestKeys
	n := 0
	for _, a := range batch {
		rk = append(rk, tier.RequestKeys{ReqID: a.req, Keys: bytes.Join(a.keys, nil)})
		n += len(a.keys)
	}
	out := make([]tier.LookupResult, n)
	if err := pr.t.LookupMany(rk, keyLen, out); err != nil {
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
func (pr *node) done(a *ask, failed bool) {
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
		pr.res.failed++
	case !slices.Equal(a.got, a.want):
		pr.res.wrong++
		pr.note(fmt.Sprintf("request %s to peer %d: answers %v, expected %v", a.req, a.target, a.got, a.want))
	default:
		pr.res.lat = append(pr.res.lat, time.Since(a.start))
	}
}

// memNow is this process's figures, with the sessions of its peers.
func memNow(peers []*node) mem {
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

// seconds is the CPU used since c0: all of it and libzmq's threads'.
func (c cpu) seconds(c0 cpu) (total, zmq float64) {
	return (c.total - c0.total).Seconds(), float64(c.zmqTick-c0.zmqTick) / benchproc.UserHZ
}

// since is "<cores> <zmq cores>": CPU used since c0 over wall, in cores.
func (c cpu) since(c0 cpu, wall time.Duration) string {
	total, zmq := c.seconds(c0)
	return fmt.Sprintf("%.3f %.3f", total/wall.Seconds(), zmq/wall.Seconds())
}

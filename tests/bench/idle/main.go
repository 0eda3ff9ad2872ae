// Command idle measures the CPU an idle peer burns, per data_transport: a
// peer built as an engine's is (node.Open on a config from JSON, the
// library's defaults, a memfd region like vLLM's /dev/shm one), left alone
// for -idle after a -settle pause, with no request and no transfer.
//
// Each measured peer runs in its own process (the program re-executes itself
// with env childEnv set), so figures do not mix; that process's CPU time
// (getrusage: user + system, every thread) over the idle wall time is the
// figure, and the busiest thread's share comes from /proc/self/task. One
// case is "auto" with one connected peerkv peer on this host (the session
// open and registered, here on the same-host path): the second peer runs in
// a third process, answering lookups as a host does. Prints, e.g.:
//
//	idle_cpu: data_transport=auto: 1.3 % of a core (paths shm+nixl+tcp; 15 threads; busiest thread 0.4 %)
//	idle_cpu: data_transport=tcp: 0.8 % of a core (paths tcp; 7 threads; busiest thread 0.2 %)
//	idle_cpu: data_transport=nixl: 1.1 % of a core (paths nixl; 15 threads; busiest thread 0.4 %)
//	idle_cpu: data_transport=auto, one peerkv peer (shm): 1.0 % of a core (paths shm+nixl+tcp; ...)
//
// A case this host cannot run (NIXL does not load) prints why instead. NIXL
// is searched in -python-prefix (default: the repository's .venv) first, as
// the library searches the engine's Python.
package main

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/peerkv/peerkv/core/node"
	"github.com/peerkv/peerkv/core/tier"
	"github.com/peerkv/peerkv/tests/bench/internal/benchproc"
)

const (
	childEnv     = "PEERKV_IDLE_CHILD"     // "measure" or "serve"
	transportEnv = "PEERKV_IDLE_TRANSPORT" // the child's data_transport
	peerEnv      = "PEERKV_IDLE_PEER"      // port of the peer a measured child connects to
	keyLen       = 36
	setupBound   = 60 * time.Second // a peer's start (NIXL init), the handshake
	userHZ       = 100              // /proc/<pid>/task/<tid>/stat ticks (USER_HZ)
)

type params struct {
	rows, rowKiB  int
	settle, idle  time.Duration
	pythonPrefix  string
	transportList string
}

func main() {
	var p params
	flag.IntVar(&p.rows, "rows", 1024, "rows in each peer's region")
	flag.IntVar(&p.rowKiB, "row-kib", 256, "row size in KiB")
	flag.DurationVar(&p.settle, "settle", time.Second, "pause after start (and after the handshake) before measuring")
	flag.DurationVar(&p.idle, "idle", 5*time.Second, "idle time measured")
	flag.StringVar(&p.pythonPrefix, "python-prefix", ".venv", "Python environment holding the nixl wheels")
	flag.StringVar(&p.transportList, "transports", "auto,tcp,nixl,auto+peer", "cases to measure, comma-separated")
	flag.Parse()
	var err error
	switch os.Getenv(childEnv) {
	case "measure":
		err = measure(p, os.Getenv(transportEnv), os.Getenv(peerEnv))
	case "serve":
		err = serve(p, os.Getenv(transportEnv))
	default:
		err = runParent(p)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "idle:", err)
		os.Exit(1)
	}
}

// open starts a peer on 127.0.0.1 at a free port, configured as the
// library is from an engine's JSON options.
func (p params) open(transport string) (*tier.Tier, error) {
	region, err := benchproc.Region("peerkv-idle", p.rows, uint64(p.rowKiB)<<10)
	if err != nil {
		return nil, err
	}
	prefix, _ := filepath.Abs(p.pythonPrefix)
	return benchproc.Open(region, func(port int) string {
		return fmt.Sprintf(`{"host":"127.0.0.1","port":%d,"data_port":0,"data_transport":%q,"key_len":%d,"hash_seed":"bench","python_prefix":%q}`,
			port, transport, keyLen, prefix)
	})
}

func port(t *tier.Tier) string { return t.LocalID()[strings.LastIndexByte(t.LocalID(), ':')+1:] }

// measure runs one peer (connected to the peer at peerPort if set), idles
// and prints one line: "cpu <figures>" or "unavailable <why>".
func measure(p params, transport, peerPort string) error {
	t, err := p.open(transport)
	if errors.Is(err, node.ErrUnavailable) {
		fmt.Println("unavailable", strings.ReplaceAll(err.Error(), "\n", " "))
		return nil
	}
	if err != nil {
		return err
	}
	defer t.Shutdown()
	path := ""
	if peerPort != "" {
		if path, err = connect(t, peerPort); err != nil {
			return err
		}
	}
	time.Sleep(p.settle) // NIXL, UCX and the handshake's stragglers settle
	before, threadsBefore, err := cpuNow()
	if err != nil {
		return err
	}
	start := time.Now()
	time.Sleep(p.idle)
	after, threadsAfter, err := cpuNow()
	if err != nil {
		return err
	}
	wall := time.Since(start)
	st := t.Stats()
	if peerPort != "" && (st.Sessions != 1 || st.DataPeers != 1) {
		return fmt.Errorf("the peer's session did not stay up while idle: %d sessions, %d data peers", st.Sessions, st.DataPeers)
	}
	busiest := 0.0
	for tid, ticks := range threadsAfter {
		busiest = max(busiest, float64(ticks-threadsBefore[tid])/userHZ)
	}
	pct := func(cpu float64) float64 { return 100 * cpu / wall.Seconds() }
	fmt.Printf("cpu %.2f %s %s %d %.2f\n", pct((after - before).Seconds()), st.DataPaths, orDash(path), len(threadsAfter), pct(busiest))
	return nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// connect opens a session with the peer at peerPort the way a consumer
// does, with one lookup (the peer answers miss), and returns the data path
// that serves it (from the peer's log line).
func connect(t *tier.Tier, peerPort string) (string, error) {
	const req = "idle-connect"
	params := fmt.Sprintf(`{"remote_kv_source":{"kv_request_id":%q,"remote_host":"127.0.0.1","remote_port":%s}}`, req, peerPort)
	if _, err := t.StartRequest(req, []byte(params)); err != nil {
		return "", err
	}
	k := sha256.Sum256([]byte("idle"))
	keys := [][]byte{append(k[:], 0, 0, 0, 0)}
	out := make([]tier.LookupResult, 1)
	deadline := time.Now().Add(setupBound)
	for {
		if err := t.Lookup(req, keys, out); err != nil {
			return "", err
		}
		if out[0] != tier.Retry {
			break
		}
		_ = t.OnScheduleEnd()
		if time.Now().After(deadline) {
			return "", fmt.Errorf("the lookup got no answer within %v", setupBound)
		}
		time.Sleep(time.Millisecond)
	}
	if err := t.FinishRequest(req); err != nil {
		return "", err
	}
	var logs []byte
	for time.Now().Before(deadline) {
		logs = append(logs, t.TakeLogs(1<<16)...)
		if st := t.Stats(); st.Sessions == 1 && st.DataPeers == 1 {
			for _, line := range bytes.Split(logs, []byte("\n")) {
				if _, path, ok := strings.Cut(string(line), ": data path "); ok {
					return strings.Fields(path)[0], nil
				}
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	return "", fmt.Errorf("no registered session with the peer within %v:\n%s", setupBound, logs)
}

// serve runs the connected peer: a host that waits on the notification fd
// and answers every lookup miss, until stdin closes.
func serve(p params, transport string) error {
	t, err := p.open(transport)
	if err != nil {
		return err
	}
	defer t.Shutdown()
	fd, err := t.NotifyFD()
	if err != nil {
		return err
	}
	defer t.CloseNotify()
	eof := make(chan struct{})
	go func() {
		_, _ = os.Stdin.Read(make([]byte, 1))
		close(eof)
	}()
	fmt.Println("ready", port(t))
	buf := make([]byte, 8)
	for {
		select {
		case <-eof:
			return nil
		default:
		}
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if n, _ := unix.Poll(fds, 100); n <= 0 {
			continue
		}
		_, _ = unix.Read(fd, buf)
		_ = t.GetFinished(1024)
		for {
			in, ok, taken := t.NextInbound(nil)
			if !ok || !taken {
				break
			}
			if in.Kind == tier.InboundEvaluate {
				_, _ = t.AnswerInbound(in.LookupID, make([]tier.LookupResult, len(in.Keys)), -1, nil)
			}
		}
	}
}

// cpuNow is this process's CPU time and each thread's, in USER_HZ ticks.
func cpuNow() (time.Duration, map[string]int64, error) {
	total, list, err := benchproc.CPU()
	threads := map[string]int64{}
	for _, th := range list {
		threads[th.ID] = th.Ticks
	}
	return total, threads, err
}

func runParent(p params) error {
	for _, c := range strings.Split(p.transportList, ",") {
		transport, withPeer := strings.CutSuffix(c, "+peer")
		label := "data_transport=" + transport
		if withPeer {
			label += ", one peerkv peer"
		}
		line, err := runCase(p, transport, withPeer)
		if err != nil {
			return fmt.Errorf("%s: %w", label, err)
		}
		fmt.Printf("idle_cpu: %s%s\n", label, line)
	}
	return nil
}

// runCase measures one case in a fresh child (and a peer child when
// withPeer) and returns what follows the label.
func runCase(p params, transport string, withPeer bool) (string, error) {
	env := []string{childEnv + "=measure", transportEnv + "=" + transport}
	if withPeer {
		peer, err := benchproc.Start(setupBound, childEnv+"=serve", transportEnv+"="+transport)
		if err != nil {
			return "", err
		}
		defer peer.Stop()
		line, err := peer.ReadLine()
		if err != nil {
			return "", fmt.Errorf("peer: %w", err)
		}
		peerPort, ok := strings.CutPrefix(line, "ready ")
		if !ok {
			return "", fmt.Errorf("peer said %q, expected ready <port>", line)
		}
		env = append(env, peerEnv+"="+peerPort)
	}
	ch, err := benchproc.Start(setupBound+p.settle+p.idle, env...)
	if err != nil {
		return "", err
	}
	defer ch.Stop()
	line, err := ch.ReadLine()
	if err != nil {
		return "", err
	}
	if why, ok := strings.CutPrefix(line, "unavailable "); ok {
		return ": not measured: " + why, nil
	}
	var pct, busiest float64
	var paths, path string
	var threads int
	if _, err := fmt.Sscanf(line, "cpu %f %s %s %d %f", &pct, &paths, &path, &threads, &busiest); err != nil {
		return "", fmt.Errorf("child said %q: %v", line, err)
	}
	via := ""
	if path != "-" {
		via = " (" + path + ")"
	}
	return fmt.Sprintf("%s: %.1f %% of a core (paths %s; %d threads; busiest thread %.1f %%)",
		via, pct, paths, threads, busiest), nil
}

package netns

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The network: host i is 10.38.i.2/24 on its eth0, routed through the
// router's end of its veth link, hi (10.38.i.1). Every address is private
// to the namespaces this suite makes, so fixed ports are safe here.
const (
	peerPort = 7000
	// hostStart bounds a host's start: a race-built binary starts slowly on
	// a loaded 2-core machine.
	hostStart = 60 * time.Second
	// replyWithin bounds a host's answer to a command that does not say
	// how long it may take.
	replyWithin = 30 * time.Second
)

var hostSeq atomic.Int32

// newHostIndex gives each host of the run its own subnet.
func newHostIndex() int { return int(hostSeq.Add(1)) }

func hostIP(i int) string { return fmt.Sprintf("10.38.%d.2", i) }

// worldLink is where the router sends every address outside the suite's
// hosts (a DNS server, 10.39.0.0/16): a veth pair whose other end is its
// own, so nothing leaves the namespace.
const worldLink = "world"

// setUpRouter turns the router namespace on: loopback up, forwarding on,
// and every address outside the suite answered at once as a network with
// no route (ICMP net unreachable, never rate-limited here), as a router
// without a route to it answers. The kernel's own no-route answer is
// rate-limited per source host, so a dial a test wants refused as
// unreachable could time out instead, and a host's DNS query wait seconds.
func setUpRouter() error {
	if err := ip("link", "set", "lo", "up"); err != nil {
		return err
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1\n"), 0o644); err != nil {
		return err
	}
	if err := os.WriteFile("/proc/sys/net/ipv4/icmp_ratelimit", []byte("0\n"), 0o644); err != nil {
		return err
	}
	for _, args := range [][]string{
		{"link", "add", worldLink, "type", "veth", "peer", "name", worldLink + "-end"},
		{"link", "set", worldLink, "up"}, {"link", "set", worldLink + "-end", "up"},
		{"route", "add", "default", "dev", worldLink},
	} {
		if err := ip(args...); err != nil {
			return err
		}
	}
	return nft(fmt.Sprintf(`table ip router {
	chain forward {
		type filter hook forward priority 0; policy accept;
		oifname %q reject with icmp type net-unreachable
	}
}`, worldLink))
}

// nft loads rules (nft -f syntax) into the router namespace.
func nft(rules string) error {
	cmd := exec.Command("nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft -f: %v: %s\nrules:\n%s", err, bytes.TrimSpace(out), rules)
	}
	return nil
}

var tableSeq atomic.Int32

// filter drops the packets the router forwards that match rules (nft rule
// bodies, each one statement line ending in a verdict), from now until the
// test ends: a table of the test's own, removed by its cleanup.
func filter(t *testing.T, rules ...string) {
	t.Helper()
	table := fmt.Sprintf("t%d", tableSeq.Add(1))
	require.NoError(t, nft(fmt.Sprintf("table ip %s {\n\tchain forward {\n\t\ttype filter hook forward priority -10; policy accept;\n\t\t%s\n\t}\n}",
		table, strings.Join(rules, "\n\t\t"))))
	t.Cleanup(func() { _ = nft("delete table ip " + table) })
}

// shape limits what the router sends to host i to rate (tc's syntax,
// "100mbit") with a token bucket (tbf: the kernel has no netem), until
// the test ends. The queue holds at most 20 ms at that rate: TCP sees
// the limit, and little waits in the router when the sender stops.
func shape(t *testing.T, i int, rate string) {
	t.Helper()
	out, err := exec.Command("tc", "qdisc", "replace", "dev", link(i), "root", "tbf",
		"rate", rate, "burst", "32kb", "latency", "20ms").CombinedOutput()
	require.NoError(t, err, "tc qdisc replace dev %s root tbf: %s", link(i), bytes.TrimSpace(out))
	t.Cleanup(func() { _ = exec.Command("tc", "qdisc", "del", "dev", link(i), "root").Run() })
}

// sentTo is how many bytes the router has put on host i's link so far
// (its veth end's tx_bytes; /proc/self/net/dev is this namespace's view,
// where /sys/class/net is the view of whoever mounted /sys).
func sentTo(i int) (uint64, error) {
	b, err := os.ReadFile("/proc/self/net/dev")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		name, counters, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(name) != link(i) {
			continue
		}
		// receive: bytes packets errs drop fifo frame compressed multicast; then transmit bytes
		f := strings.Fields(counters)
		if len(f) < 9 {
			break
		}
		return strconv.ParseUint(f[8], 10, 64)
	}
	return 0, fmt.Errorf("no link %s in /proc/self/net/dev", link(i))
}

// ip runs ip(8) in the router namespace.
func ip(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, bytes.TrimSpace(out))
	}
	return nil
}

// cut records the hosts cut off now: a host started while cut off keeps
// its link down until reconnect.
var cut = struct {
	sync.Mutex
	hosts map[int]bool
}{hosts: map[int]bool{}}

func link(i int) string { return fmt.Sprintf("h%d", i) }

// cutOff makes host i a black hole: every packet to or from it dropped at
// the router, silently (its link is down, and the route to its address
// discards without an ICMP answer). A partition, or a host that lost
// power, as its peers see it.
func cutOff(t *testing.T, i int) {
	t.Helper()
	cut.Lock()
	cut.hosts[i] = true
	cut.Unlock()
	t.Cleanup(func() { _ = reconnect(i) })
	require.NoError(t, ip("route", "replace", "blackhole", hostIP(i)+"/32"))
	require.NoError(t, ip("link", "set", link(i), "down"))
}

// reconnect ends cutOff: host i's link up, its route back.
func reconnect(i int) error {
	cut.Lock()
	defer cut.Unlock()
	if !cut.hosts[i] {
		return nil
	}
	delete(cut.hosts, i)
	if err := ip("link", "set", link(i), "up"); err != nil {
		return err
	}
	return ip("route", "del", "blackhole", hostIP(i)+"/32")
}

func isCutOff(i int) bool {
	cut.Lock()
	defer cut.Unlock()
	return cut.hosts[i]
}

// host is one peer process, alone in its network namespace: when it dies
// the namespace and its link go with it.
type host struct {
	t     *testing.T
	index int
	name  string // for messages: "producer", "consumer #2", ...
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	logs  *syncBuffer // the process's stderr: its node's log lines
	done  chan struct{}
}

// hostOptions are the node options every host shares; scenarios add theirs.
func hostOptions(i int, extra map[string]any) map[string]any {
	o := map[string]any{
		"host": hostIP(i), "port": peerPort, "data_port": 0, "data_transport": "tcp",
		"hash_seed": "42", "config_fingerprint": "0123456789abcdef", "key_len": 36,
		"load_timeout_s": 2.0, "abort_ack_timeout_s": 1.0, "store_timeout_s": 4.0, "unbound_store_timeout_s": 4.0,
		"tick_s": 0.005, "shutdown_drain_timeout_s": 0.5, "drain_timeout_s": 3.0,
	}
	for k, v := range extra {
		o[k] = v
	}
	return o
}

// startHost starts a peer as host i (a new namespace linked to the
// router), with env added to its environment, and waits until its node
// is open. The cleanup ends it and, failed, prints its logs.
func startHost(t *testing.T, i int, name string, options map[string]any, env ...string) *host {
	t.Helper()
	opts, err := json.Marshal(options)
	require.NoError(t, err)
	cmd := reexec()
	cmd.Env = append(append(os.Environ(), peerEnv+"="+string(opts)), env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	h := &host{t: t, index: i, name: fmt.Sprintf("%s (%s)", name, hostIP(i)), cmd: cmd,
		lines: make(chan string, 64), logs: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stderr = h.logs
	h.stdin, err = cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start(), "start %s in a new network namespace", h.name)
	go func() {
		sc := bufio.NewScanner(stdout)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
		_ = h.cmd.Wait()
		close(h.done)
		close(h.lines)
	}()
	t.Cleanup(h.stop)
	require.NoError(t, ip("link", "add", link(i), "type", "veth", "peer", "name", "eth0", "netns", fmt.Sprint(cmd.Process.Pid)))
	require.NoError(t, ip("addr", "add", fmt.Sprintf("10.38.%d.1/24", i), "dev", link(i)))
	if !isCutOff(i) {
		require.NoError(t, ip("link", "set", link(i), "up"))
	}
	var ready struct{ ID string }
	h.call(&ready, hostStart, "net %s/24 %s", hostIP(i), fmt.Sprintf("10.38.%d.1", i))
	require.Equal(t, fmt.Sprintf("%s:%d", hostIP(i), peerPort), ready.ID)
	return h
}

// call sends one command and decodes its one-line JSON answer into out
// (nil: any answer), waiting at most within.
func (h *host) call(out any, within time.Duration, format string, args ...any) {
	h.t.Helper()
	cmd := fmt.Sprintf(format, args...)
	_, err := fmt.Fprintln(h.stdin, cmd)
	require.NoError(h.t, err, "%s: send %q", h.name, cmd)
	select {
	case line, ok := <-h.lines:
		require.True(h.t, ok, "%s exited during %q; its log:\n%s", h.name, cmd, h.logs)
		var reply struct {
			Error string          `json:"error"`
			Value json.RawMessage `json:"value"`
		}
		require.NoError(h.t, json.Unmarshal([]byte(line), &reply), "%s answered %q", h.name, line)
		require.Empty(h.t, reply.Error, "%s: %q", h.name, cmd)
		if out != nil {
			require.NoError(h.t, json.Unmarshal(reply.Value, out), "%s answered %q", h.name, line)
		}
	case <-time.After(within):
		require.FailNow(h.t, "host silent", "%s: no answer to %q within %v; its log:\n%s", h.name, cmd, within, h.logs)
	}
}

// crash kills the host without a word reaching anyone: it is cut off
// first, so the FIN or RST its kernel sends as the process dies is dropped;
// its namespace and link go with it. It stays cut off (a restart on its
// address comes up with its link down) until reconnect.
func (h *host) crash() {
	h.t.Helper()
	cutOff(h.t, h.index)
	require.NoError(h.t, h.cmd.Process.Kill())
	select {
	case <-h.done:
	case <-time.After(10 * time.Second):
		require.FailNow(h.t, "host not reaped", "%s survived SIGKILL for 10 s", h.name)
	}
	// The kernel tears a namespace down in the background: remove its link
	// now, so that the restart can make the same one.
	_ = ip("link", "del", link(h.index))
	require.Eventually(h.t, func() bool { return ip("link", "show", link(h.index)) != nil },
		10*time.Second, 10*time.Millisecond, "%s's link outlived it", h.name)
}

// stop ends the host (stdin closed: it shuts its node down and exits;
// SIGKILL after 10 s) and, when the test failed, prints its logs.
func (h *host) stop() {
	_ = h.stdin.Close()
	select {
	case <-h.done:
	case <-time.After(10 * time.Second):
		_ = h.cmd.Process.Kill()
		<-h.done
	}
	if h.t.Failed() {
		h.t.Logf("%s log:\n%s", h.name, h.logs)
	}
}

// syncBuffer is a bytes.Buffer safe for a writer and readers at once.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

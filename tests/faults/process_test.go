package faults

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/node"
	"github.com/peerkv/peerkv/core/tier"
)

// childEnv selects the producer role of TestChildProducer in a re-executed
// test binary: "<port> <kv_request_id> <rows> <ms between stores>".
const childEnv = "PEERKV_FAULTS_CHILD"

const childRows = 32

// nodeOptions are Config's deadlines as a host's JSON options.
func nodeOptions(port int) []byte {
	b, err := json.Marshal(map[string]any{
		"host": "127.0.0.1", "port": port, "data_port": 0, "data_transport": "tcp",
		"hash_seed": HashSeed, "config_fingerprint": Fingerprint, "key_len": KeyLen,
		"handshake_timeout_s": 2.0, "lookup_timeout_s": 2.0, "load_timeout_s": 2.0, "abort_ack_timeout_s": 1.0,
		"store_timeout_s": 3.0, "unbound_store_timeout_s": 3.0, "inbound_lookup_timeout_s": 1.0,
		"tick_s": 0.005, "shutdown_drain_timeout_s": 0.5, "drain_timeout_s": 3.0,
	})
	if err != nil {
		panic(err)
	}
	return b
}

// mappedRegion is anonymous mmap memory, as a host's region is: outside
// the Go heap, so the race detector does not see the TCP receiver's
// writes, ordered by the other process, as racing with our reads.
func mappedRegion(rows int) (data.Region, func(), error) {
	mem, err := syscall.Mmap(-1, 0, rows*RowLen, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return data.Region{}, nil, err
	}
	return data.Region{Mem: mem, RowLen: RowLen}, func() { _ = syscall.Munmap(mem) }, nil
}

// TestChildProducer is the child role, and skips in a normal run: a PD
// prefiller that, once a decoder's fetch waits, stores one row per tick
// (printing "stored N"), then serves until its stdin closes.
func TestChildProducer(t *testing.T) {
	spec := os.Getenv(childEnv)
	if spec == "" {
		t.Skip("the producer child of the process tests")
	}
	var port, rows, gap int
	var kv string
	_, err := fmt.Sscanf(spec, "%d %s %d %d", &port, &kv, &rows, &gap)
	require.NoError(t, err)
	cfg, err := config.FromJSON(nodeOptions(port))
	require.NoError(t, err)
	region, unmap, err := mappedRegion(rows)
	require.NoError(t, err)
	defer unmap()
	tr, err := node.Open(cfg, region)
	require.NoError(t, err)
	defer func() { _ = tr.Shutdown() }()
	fmt.Println("ready")

	stdin := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(stdin) }()
	_, err = tr.StartRequest("prefill", decoderParams(kv))
	require.NoError(t, err)
	for tr.Stats().ServeKeysWanted == 0 { // the decoder's fetch waits here
		select {
		case <-stdin:
			return
		case <-time.After(2 * time.Millisecond):
		}
	}
	for i, k := range keysFor(kv, rows) {
		Fill(region.Row(uint64(i)), k)
		require.NoError(t, tr.SubmitStore("prefill", int64(i+1), [][]byte{k}, []int64{int64(i)}))
		fmt.Printf("stored %d\n", i+1)
		time.Sleep(time.Duration(gap) * time.Millisecond)
	}
	require.NoError(t, tr.FinishRequest("prefill"))
	for {
		tr.GetFinished(1024)
		select {
		case <-stdin:
			return
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// child is a producer process.
type child struct {
	cmd   *exec.Cmd
	port  int
	kv    string
	stdin io.WriteCloser
	lines chan string
}

func startChild(t *testing.T, kv string, gap time.Duration) *child {
	t.Helper()
	port := freePort(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestChildProducer$", "-test.count=1")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%d %s %d %d", childEnv, port, kv, childRows, gap.Milliseconds()))
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	c := &child{cmd: cmd, port: port, kv: kv, stdin: stdin, lines: make(chan string, 256)}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	t.Cleanup(c.stop)
	c.await(t, "ready", 20*time.Second) // a race-built binary starts slowly on 2 cores
	return c
}

// await waits for a line from the child.
func (c *child) await(t *testing.T, line string, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	for {
		select {
		case l, ok := <-c.lines:
			require.True(t, ok, "the child exited before printing %q", line)
			if l == line {
				return
			}
		case <-deadline:
			require.FailNow(t, "child silent", "no %q within %v", line, within)
		}
	}
}

// stop ends the child (closing stdin, then SIGKILL) and reaps it.
func (c *child) stop() {
	_ = c.cmd.Process.Signal(syscall.SIGCONT)
	_ = c.stdin.Close()
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

// freePort returns a loopback port free right now, below the kernel's
// ephemeral range: a port bind(0) hands out is ephemeral, and the other
// packages' tests open thousands of connections whose source ports could
// take it before the node binds it.
func freePort(t *testing.T) int {
	for range 500 {
		p := 20000 + rand.IntN(12000)
		if ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p)); err == nil {
			_ = ln.Close()
			return p
		}
	}
	t.Fatal("no free port below the ephemeral range")
	return 0
}

// decoderNode is the consumer: a real node in this process.
type decoderNode struct {
	*tier.Tier
	t      *testing.T
	region data.Region
	ledger *Ledger
}

func openDecoder(t *testing.T) *decoderNode {
	region, unmap, err := mappedRegion(childRows)
	require.NoError(t, err)
	cfg, err := config.FromJSON(nodeOptions(freePort(t)))
	require.NoError(t, err)
	tr, err := node.Open(cfg, region)
	require.NoError(t, err)
	d := &decoderNode{Tier: tr, t: t, region: region, ledger: NewLedger()}
	t.Cleanup(func() {
		_ = tr.Shutdown()
		d.collect()
		require.Empty(t, d.ledger.Unreported(), "shutdown reports every job")
		require.Empty(t, d.ledger.Problems())
		unmap()
	})
	return d
}

func (d *decoderNode) collect() { d.ledger.Collect(d.LocalID(), d.Tier) }

// pull submits the load of every row of c's kv; its rows are poisoned.
func (d *decoderNode) pull(c *child) (req string, job int64, start time.Time) {
	req = "d-" + c.kv
	params := fmt.Appendf(nil, `{"remote_prefiller":{"kv_request_id":%q,"remote_host":"127.0.0.1","remote_port":%d}}`, c.kv, c.port)
	_, err := d.StartRequest(req, params)
	require.NoError(d.t, err)
	slots := make([]int64, childRows)
	for i := range slots {
		slots[i] = int64(i)
		Poison(d.region.Row(uint64(i)))
	}
	job = NextJob()
	d.ledger.Submit(d.LocalID(), job, "load "+req)
	require.NoError(d.t, d.SubmitLoad(req, job, keysFor(c.kv, childRows), slots))
	return req, job, time.Now()
}

// result waits (bounded) for the job's report.
func (d *decoderNode) result(job int64, within time.Duration) tier.JobResult {
	var r tier.JobResult
	require.Eventually(d.t, func() bool {
		d.collect()
		var ok bool
		r, ok = d.ledger.Result(job)
		return ok
	}, within, 2*time.Millisecond, "job %d not reported within %v", job, within)
	return r
}

// quiet waits until the decoder holds nothing.
func (d *decoderNode) quiet() {
	require.Eventually(d.t, func() bool {
		s := d.Stats()
		return s.JobsInFlight == 0 && s.ExpectedRows == 0 && s.ParkedStores == 0 && s.InboundActive == 0
	}, 3*time.Second, 5*time.Millisecond, "decoder not quiet")
}

// thenFreshProducerServes: a later request to a new producer process
// gets every byte.
func (d *decoderNode) thenFreshProducerServes() {
	c := startChild(d.t, uniq("fresh"), 0)
	req, job, _ := d.pull(c)
	r := d.result(job, loadBound)
	require.True(d.t, r.Success, "a fresh producer serves")
	for i, k := range keysFor(c.kv, childRows) {
		require.Equal(d.t, -1, Check(d.region.Row(uint64(i)), k), "wrong bytes in slot %d", i)
	}
	require.NoError(d.t, d.FinishRequest(req))
	d.quiet()
}

// TestProcessProducerKilled: the producer process is SIGKILLed while its
// rows flow. The load is reported failed within load + abort-ack timeouts,
// exactly once, and a fresh producer serves the next request.
func TestProcessProducerKilled(t *testing.T) {
	t.Parallel()
	d := openDecoder(t)
	c := startChild(t, uniq("killed"), 40*time.Millisecond)
	req, job, _ := d.pull(c)
	c.await(t, "stored 4", loadBound)
	require.NoError(t, c.cmd.Process.Kill())
	killed := time.Now()
	r := d.result(job, loadBound)
	require.False(t, r.Success)
	require.Less(t, time.Since(killed), loadBound)
	t.Logf("load reported failed %v after SIGKILL", time.Since(killed).Round(time.Millisecond))
	time.Sleep(500 * time.Millisecond) // a second report would come now
	d.collect()
	require.Empty(t, d.ledger.Problems())
	require.NoError(t, d.FinishRequest(req))
	d.quiet()
	d.thenFreshProducerServes()
}

// TestProcessProducerStopped: the producer process is SIGSTOPped while its
// rows flow, past the load deadline, then SIGCONTed. The load is reported
// failed by its deadlines, exactly once; the producer's late answers and
// rows are ignored; a fresh producer serves the next request.
func TestProcessProducerStopped(t *testing.T) {
	t.Parallel()
	d := openDecoder(t)
	c := startChild(t, uniq("stopped"), 40*time.Millisecond)
	req, job, start := d.pull(c)
	c.await(t, "stored 4", loadBound)
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGSTOP))
	r := d.result(job, loadBound)
	require.False(t, r.Success)
	require.Less(t, time.Since(start), loadBound)
	t.Logf("load reported failed %v after its submission", time.Since(start).Round(time.Millisecond))
	time.Sleep(time.Until(start.Add(4 * time.Second)))
	require.NoError(t, c.cmd.Process.Signal(syscall.SIGCONT))
	// It wakes up and goes on storing into rows no longer expected.
	c.await(t, "stored "+strconv.Itoa(childRows), 5*time.Second)
	time.Sleep(500 * time.Millisecond)
	d.collect()
	require.Empty(t, d.ledger.Problems(), "exactly once")
	for i := 4; i < childRows; i++ {
		row := d.region.Row(uint64(i))
		require.True(t, Poisoned(row) || Check(row, keysFor(c.kv, childRows)[i]) == -1,
			"slot %d holds bytes that are neither untouched nor its own", i)
	}
	require.True(t, Poisoned(d.region.Row(childRows-1)), "a row stored after the load failed landed")
	require.NoError(t, d.FinishRequest(req))
	d.quiet()
	d.thenFreshProducerServes()
}

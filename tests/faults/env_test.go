package faults

import (
	"errors"
	"fmt"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/tier"
)

// Bounds every wait of the suite derives from Config's deadlines.
const (
	numRows = 64
	slack   = time.Second
	// loadBound: a load is reported within load + abort-ack timeouts.
	loadBound = 2*time.Second + time.Second + slack
	// probeBound: lookups answer within handshake + lookup timeouts.
	probeBound = 2*time.Second + 2*time.Second + slack
	// jobsBound: a store or pin is held at most unbound + store timeouts.
	jobsBound = 3*time.Second + 3*time.Second + slack
	// late is how late a "late" frame comes: past every 2 s deadline.
	late = 2500 * time.Millisecond
)

const (
	prodPort = 6001
	consPort = 6002
)

var nameSeq atomic.Int64

func uniq(prefix string) string { return fmt.Sprintf("%s-%d", prefix, nameSeq.Add(1)) }

// env is one test's cluster and host loop.
type env struct {
	t     *testing.T
	c     *Cluster
	nodes []*Node // live nodes: served, collected and checked at the end

	mu      sync.Mutex
	stepErr error
	next    map[*Node]int64
}

func newEnv(t *testing.T) *env {
	return &env{t: t, c: NewCluster(), next: map[*Node]int64{}}
}

func (e *env) open(port int, mutate ...func(*config.Config)) *Node {
	p, err := e.c.Open(port, numRows, uint64(port)+uint64(nameSeq.Add(1)), mutate...)
	require.NoError(e.t, err)
	e.mu.Lock()
	e.nodes = append(e.nodes, p)
	e.mu.Unlock()
	e.t.Cleanup(func() {
		_ = p.Shutdown()
		if e.t.Failed() || testing.Verbose() && os.Getenv("PEERKV_FAULTS_LOGS") != "" {
			e.t.Logf("logs of %s:\n%s", p.ID, p.TakeLogs(1<<20))
		}
	})
	return p
}

// shutdown stops p (bounded) and stops serving it.
func (e *env) shutdown(p *Node) {
	done := make(chan error, 1)
	go func() { done <- p.Shutdown() }()
	select {
	case err := <-done:
		require.NoError(e.t, err)
	case <-time.After(5 * time.Second):
		require.FailNow(e.t, "shutdown did not return within 5s", p.ID)
	}
	p.Collect()
	e.mu.Lock()
	e.nodes = slices.DeleteFunc(e.nodes, func(q *Node) bool { return q == p })
	e.mu.Unlock()
}

// step is one pass of every host: serve inbound lookups, collect jobs.
// It may run on require.Eventually's goroutine, so it records errors.
func (e *env) step() {
	e.mu.Lock()
	nodes := slices.Clone(e.nodes)
	e.mu.Unlock()
	for _, p := range nodes {
		if err := p.Serve(); err != nil {
			e.mu.Lock()
			e.stepErr = errors.Join(e.stepErr, err)
			e.mu.Unlock()
		}
		p.Collect()
	}
}

func (e *env) checkStep() {
	e.mu.Lock()
	defer e.mu.Unlock()
	require.NoError(e.t, e.stepErr, "host serve pass")
}

// eventually waits (bounded) for cond, stepping the hosts meanwhile; why
// says, at the deadline, what was still missing.
func (e *env) eventually(cond func() bool, within time.Duration, why func() string) {
	e.t.Helper()
	if !assert.Eventually(e.t, func() bool { e.step(); return cond() }, within, 2*time.Millisecond) {
		require.FailNow(e.t, fmt.Sprintf("not within %v: %s", within, why()))
	}
	e.checkStep()
}

func says(format string, args ...any) func() string {
	return func() string { return fmt.Sprintf(format, args...) }
}

// idle keeps the hosts stepping for d.
func (e *env) idle(d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		e.step()
		time.Sleep(2 * time.Millisecond)
	}
	e.checkStep()
}

// wait returns a job's single report, failing the test after within.
func (e *env) wait(job int64, within time.Duration) tier.JobResult {
	e.t.Helper()
	var r tier.JobResult
	e.eventually(func() bool {
		var ok bool
		r, ok = e.c.Ledger.Result(job)
		return ok
	}, within, says("job %d not reported", job))
	return r
}

// rows hands out rows of p's region, round robin.
func (e *env) rows(p *Node, n int) []int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	out := make([]int64, n)
	for i := range out {
		out[i] = e.next[p] % numRows
		e.next[p]++
	}
	return out
}

// finish asserts the suite's invariants: delayed frames drained, every
// job reported exactly once, nothing reported unasked, every node quiet.
func (e *env) finish() {
	e.t.Helper()
	e.mu.Lock()
	nodes := slices.Clone(e.nodes)
	e.mu.Unlock()
	for _, p := range nodes {
		p.Wire.Release()
	}
	e.eventually(func() bool {
		for _, p := range nodes {
			if p.Wire.Pending() > 0 {
				return false
			}
		}
		return true
	}, late+slack, says("frames still delayed"))
	e.eventually(func() bool { return len(e.c.Ledger.Unreported()) == 0 }, jobsBound,
		func() string { return fmt.Sprintf("jobs never reported: %v", e.c.Ledger.Unreported()) })
	e.eventually(func() bool {
		for _, p := range nodes {
			if p.Quiet() != "" {
				return false
			}
		}
		return true
	}, 3*time.Second, func() string { return fmt.Sprintf("nodes not quiet: %v", quietReport(nodes)) })
	e.idle(20 * time.Millisecond) // a late second report would show now
	require.Empty(e.t, e.c.Ledger.Problems(), "exactly-once")
	for _, p := range nodes {
		require.Empty(e.t, p.Stats().Poisoned, p.ID)
	}
}

func quietReport(nodes []*Node) []string {
	var out []string
	for _, p := range nodes {
		if q := p.Quiet(); q != "" {
			out = append(out, q)
		}
	}
	return out
}

func keysFor(kv string, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = Key(fmt.Sprintf("%s/%d", kv, i))
	}
	return out
}

func portOf(p *Node) string {
	_, port, err := net.SplitHostPort(p.ID)
	if err != nil {
		panic(err)
	}
	return port
}

func decoderParams(kv string) []byte {
	return fmt.Appendf(nil, `{"remote_decoder":{"kv_request_id":%q}}`, kv)
}

func prefillerParams(kv string, prod *Node) []byte {
	return fmt.Appendf(nil, `{"remote_prefiller":{"kv_request_id":%q,"remote_host":"127.0.0.1","remote_port":%s}}`,
		kv, portOf(prod))
}

func sourceParams(kv string, prod *Node) []byte {
	return fmt.Appendf(nil, `{"remote_kv_source":{"kv_request_id":%q,"remote_host":"127.0.0.1","remote_port":%s}}`,
		kv, portOf(prod))
}

package hostile

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/node"
	"github.com/peerkv/peerkv/core/tier"
)

// Node is one real peerkv node plus the host-side bookkeeping the tests
// need: every job it submitted, every report (a second report of one job
// fails the test), and the logs taken so far.
type Node struct {
	*tier.Tier
	t      *testing.T
	Cfg    config.Config
	Region data.Region

	mu        sync.Mutex
	logs      strings.Builder
	submitted map[int64]string // job -> what it was, for messages
	seen      map[int64]tier.JobResult
}

var jobSeq atomic.Int64

// NextJob returns a job id no other job in this process uses.
func NextJob() int64 { return jobSeq.Add(1) }

var idSeq atomic.Int64

// uniq returns a fresh id with prefix p.
func uniq(p string) string { return fmt.Sprintf("%s-%d", p, idSeq.Add(1)) }

// baseOptions: short deadlines, TCP data path, the shared layout.
func baseOptions() map[string]any {
	return map[string]any{
		"host": "127.0.0.1", "data_port": 0, "hash_seed": HashSeed, "config_fingerprint": Fingerprint,
		"key_len": KeyLen, "data_transport": "tcp",
		"handshake_timeout_s": 2.0, "lookup_timeout_s": 2.0, "load_timeout_s": 3.0, "abort_ack_timeout_s": 1.0,
		"store_timeout_s": 3.0, "unbound_store_timeout_s": 3.0, "inbound_lookup_timeout_s": 1.0,
		"tick_s": 0.01, "shutdown_drain_timeout_s": 0.5, "drain_timeout_s": 3.0,
	}
}

// OpenNode opens a node at 127.0.0.1:<free port> (or opts["host"]) with
// baseOptions overridden by opts; a nil value removes an option. At the end
// of the test it checks that every job was reported exactly once and shuts
// the node down (bounded).
func OpenNode(t *testing.T, opts map[string]any) *Node {
	t.Helper()
	return openNode(t, opts, data.Region{Mem: make([]byte, NumRows*RowLen), RowLen: RowLen})
}

// OpenShmNode is OpenNode over a region mapped MAP_SHARED from a file in
// /dev/shm, as vLLM's is: the only kind the same-host path serves.
func OpenShmNode(t *testing.T, opts map[string]any) *Node {
	t.Helper()
	dir := "/dev/shm"
	if st, err := os.Stat(dir); err != nil || !st.IsDir() {
		dir = t.TempDir()
	}
	f, err := os.CreateTemp(dir, "peerkv-hostile-*")
	require.NoError(t, err)
	defer f.Close()
	defer os.Remove(f.Name())
	require.NoError(t, f.Truncate(NumRows*RowLen))
	mem, err := syscall.Mmap(int(f.Fd()), 0, NumRows*RowLen, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_SHARED)
	require.NoError(t, err)
	t.Cleanup(func() { _ = syscall.Munmap(mem) }) // runs after the node's own cleanup
	return openNode(t, opts, data.Region{Mem: mem, RowLen: RowLen})
}

func openNode(t *testing.T, opts map[string]any, region data.Region) *Node {
	t.Helper()
	o := baseOptions()
	for k, v := range opts {
		if v == nil {
			delete(o, k)
		} else {
			o[k] = v
		}
	}
	host, _ := o["host"].(string)
	var tr *tier.Tier
	var cfg config.Config
	for attempt := 0; ; attempt++ {
		o["port"] = FreePort(t, host)
		raw, err := json.Marshal(o)
		require.NoError(t, err)
		cfg, err = config.FromJSON(raw)
		require.NoError(t, err, "options %s", raw)
		tr, err = node.Open(cfg, region)
		if err == nil {
			break
		}
		require.Less(t, attempt, 5, "open node: %v", err)
	}
	n := &Node{Tier: tr, t: t, Cfg: cfg, Region: region, submitted: map[int64]string{}, seen: map[int64]tier.JobResult{}}
	t.Cleanup(n.close)
	return n
}

// ID is the node's peer id.
func (n *Node) ID() string { return n.LocalID() }

// Port is the node's control port.
func (n *Node) Port() int { return n.Cfg.Port }

func (n *Node) close() {
	n.Collect()
	done := make(chan error, 1)
	go func() { done <- n.Shutdown() }()
	select {
	case err := <-done:
		if err != nil {
			n.t.Errorf("%s: shutdown: %v", n.ID(), err)
		}
	case <-time.After(10 * time.Second):
		n.t.Errorf("%s: shutdown did not return within 10s", n.ID())
		return
	}
	n.Collect()
	n.mu.Lock()
	defer n.mu.Unlock()
	for id, what := range n.submitted {
		if _, ok := n.seen[id]; !ok {
			n.t.Errorf("%s: job %d (%s) was never reported, not even by shutdown", n.ID(), id, what)
		}
	}
}

// Collect moves finished jobs into the record, failing on a second report.
func (n *Node) Collect() {
	for {
		rs := n.GetFinished(4096)
		if len(rs) == 0 {
			return
		}
		n.mu.Lock()
		for _, r := range rs {
			if _, dup := n.seen[r.JobID]; dup {
				n.t.Errorf("%s: job %d reported twice", n.ID(), r.JobID)
			}
			if _, ok := n.submitted[r.JobID]; !ok {
				n.t.Errorf("%s: job %d reported but never submitted", n.ID(), r.JobID)
			}
			n.seen[r.JobID] = r
		}
		n.mu.Unlock()
	}
}

// Result returns a job's report if it came.
func (n *Node) Result(job int64) (tier.JobResult, bool) {
	n.Collect()
	n.mu.Lock()
	defer n.mu.Unlock()
	r, ok := n.seen[job]
	return r, ok
}

// WaitJob waits up to within for a job's single report.
func (n *Node) WaitJob(job int64, within time.Duration) (tier.JobResult, bool) {
	deadline := time.Now().Add(within)
	for {
		if r, ok := n.Result(job); ok {
			return r, true
		}
		if time.Now().After(deadline) {
			return tier.JobResult{}, false
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// MustJob is WaitJob that fails the test on timeout.
func (n *Node) MustJob(job int64, within time.Duration) tier.JobResult {
	n.t.Helper()
	r, ok := n.WaitJob(job, within)
	require.True(n.t, ok, "%s: job %d not reported within %v", n.ID(), job, within)
	return r
}

// Store submits a store job for reqID from rows (filled with the key pattern first).
func (n *Node) Store(reqID string, keys [][]byte, rows []int) int64 {
	n.t.Helper()
	slots := make([]int64, len(rows))
	for i, r := range rows {
		Fill(n.Region.Row(uint64(r)), keys[i])
		slots[i] = int64(r)
	}
	job := NextJob()
	n.mu.Lock()
	n.submitted[job] = "store " + reqID
	n.mu.Unlock()
	require.NoError(n.t, n.SubmitStore(reqID, job, keys, slots))
	return job
}

// Load submits a load job for reqID into rows.
func (n *Node) Load(reqID string, keys [][]byte, rows []int) int64 {
	n.t.Helper()
	slots := make([]int64, len(rows))
	for i, r := range rows {
		slots[i] = int64(r)
	}
	job := NextJob()
	n.mu.Lock()
	n.submitted[job] = "load " + reqID
	n.mu.Unlock()
	require.NoError(n.t, n.SubmitLoad(reqID, job, keys, slots))
	return job
}

// Start starts reqID with kv_transfer_params p.
func (n *Node) Start(reqID string, p map[string]any) tier.Policy {
	n.t.Helper()
	raw, err := json.Marshal(p)
	require.NoError(n.t, err)
	pol, err := n.StartRequest(reqID, raw)
	require.NoError(n.t, err, "start %s %s", reqID, raw)
	return pol
}

// Prefill starts a prefill request whose decoder fetches kv.
func (n *Node) Prefill(reqID, kv string) {
	n.Start(reqID, map[string]any{"remote_decoder": map[string]any{"kv_request_id": kv}})
}

// Decode starts a PD decoder request pulling kv from peer id src.
func (n *Node) Decode(reqID, kv, src string) {
	n.Start(reqID, map[string]any{"remote_prefiller": source(kv, src)})
}

// Consume starts a symmetric P2P consumer request pulling kv from src.
func (n *Node) Consume(reqID, kv, src string) {
	n.Start(reqID, map[string]any{"remote_kv_source": source(kv, src)})
}

func source(kv, peerID string) map[string]any {
	i := strings.LastIndexByte(peerID, ':')
	port, _ := strconv.Atoi(peerID[i+1:])
	return map[string]any{"kv_request_id": kv, "remote_host": peerID[:i], "remote_port": port}
}

// LookupAll returns the node's answers for keys of reqID.
func (n *Node) LookupAll(reqID string, keys [][]byte) []tier.LookupResult {
	n.t.Helper()
	out := make([]tier.LookupResult, len(keys))
	require.NoError(n.t, n.Lookup(reqID, keys, out))
	return out
}

// Logs returns every log line taken from the node so far (kept across calls).
func (n *Node) Logs() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.logs.Write(n.TakeLogs(1 << 20))
	return n.logs.String()
}

// LogMatch waits up to within for a log line matching re.
func (n *Node) LogMatch(re string, within time.Duration) (string, bool) {
	rx := regexp.MustCompile(re)
	deadline := time.Now().Add(within)
	for {
		for _, l := range strings.Split(n.Logs(), "\n") {
			if rx.MatchString(l) {
				return l, true
			}
		}
		if time.Now().After(deadline) {
			return "", false
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Registered reports whether peerID is registered with the node's data
// path now, or the node logged that it was (the line the tier writes once a
// peer's data-path registration succeeded; rate-limited for peers that
// dialed the node).
func (n *Node) Registered(peerID string) bool {
	return n.HasDataPath(peerID) || strings.Contains(n.Logs(), "peer "+peerID+": data path ")
}

// Gauge reads a Stats field by its JSON name; ok is false when the tier has
// no such field (yet).
func (n *Node) Gauge(name string) (int64, bool) {
	raw, err := json.Marshal(n.Stats())
	require.NoError(n.t, err)
	var m map[string]any
	require.NoError(n.t, json.Unmarshal(raw, &m))
	v, ok := m[name].(float64)
	return int64(v), ok
}

// GaugeNames lists the Stats fields, for messages.
func (n *Node) GaugeNames() []string {
	raw, _ := json.Marshal(n.Stats())
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	return sortedKeys(m)
}

func sortedKeys(m map[string]any) []string { return slices.Sorted(maps.Keys(m)) }

// RequireGauge fails the test when the tier lacks gauge name (the lead adds
// it) and otherwise waits up to within for ok(value).
func (n *Node) RequireGauge(name string, within time.Duration, ok func(int64) bool, what string) {
	n.t.Helper()
	_, has := n.Gauge(name)
	if !has {
		n.t.Errorf("%s: Stats has no %q gauge (have %v): cannot check that %s", n.ID(), name, n.GaugeNames(), what)
		return
	}
	var last int64
	require.Eventually(n.t, func() bool {
		last, _ = n.Gauge(name)
		return ok(last)
	}, within, 10*time.Millisecond, "%s: Stats %s=%d: %s", n.ID(), name, last, what)
}

// ---- keys and rows --------------------------------------------------------------

// Key is a 36-byte offload key derived from (space, i).
func Key(space string, i int) []byte {
	k := sha256.Sum256([]byte(space + "/" + strconv.Itoa(i)))
	return append(k[:], 0, 0, 0, 0)
}

// Keys returns n keys of space.
func Keys(space string, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = Key(space, i)
	}
	return out
}

// Fill writes the pattern derived from key into row.
func Fill(row, key []byte) {
	seed := binary.LittleEndian.Uint64(key)
	for off := 0; off+8 <= len(row); off += 8 {
		binary.LittleEndian.PutUint64(row[off:], uint64(off)^seed)
	}
}

// Holds reports whether row carries key's pattern.
func Holds(row, key []byte) bool {
	want := make([]byte, len(row))
	Fill(want, key)
	return string(want) == string(row)
}

// Range returns the ints [from, from+n).
func Range(from, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = from + i
	}
	return out
}

// ---- the health check ---------------------------------------------------------------

// Pull is the proof that prod still serves a real peer: a PD transfer of 4
// rows from prod (rows 48..51) to dec (rows 56..59), every byte checked, both
// jobs reported once and successfully.
func Pull(t *testing.T, prod, dec *Node) {
	t.Helper()
	kv := uniq("health")
	keys := Keys(kv, 4)
	prod.Prefill(kv+"-p", kv)
	dec.Decode(kv+"-d", kv, prod.ID())
	for i, r := range dec.LookupAll(kv+"-d", keys) {
		require.Equal(t, tier.Hit, r, "health pull: decoder lookup of key %d", i)
	}
	// Let the two register each other first, so that a slow handshake on a
	// loaded machine cannot outlast short store timeouts of the test.
	within(t, 6*time.Second, func() bool { return dec.Registered(prod.ID()) && prod.Registered(dec.ID()) },
		"health pull: %s and %s never registered each other.\nproducer: %s\ndecoder: %s",
		prod.ID(), dec.ID(), tail(prod.Logs()), tail(dec.Logs()))
	store := prod.Store(kv+"-p", keys, Range(48, 4))
	load := dec.Load(kv+"-d", keys, Range(56, 4))
	lr := dec.MustJob(load, 6*time.Second)
	require.True(t, lr.Success, "health pull of %s from %s to %s failed.\nproducer: %s\ndecoder: %s",
		kv, prod.ID(), dec.ID(), tail(prod.Logs()), tail(dec.Logs()))
	for i, r := range Range(56, 4) {
		require.True(t, Holds(dec.Region.Row(uint64(r)), keys[i]), "health pull: row %d holds the wrong bytes", r)
	}
	require.NoError(t, prod.FinishRequest(kv+"-p"))
	require.NoError(t, dec.FinishRequest(kv+"-d"))
	sr := prod.MustJob(store, 6*time.Second)
	require.True(t, sr.Success, "health pull: the producer's store job failed")
}

// tail is the end of a log, for failure messages.
func tail(s string) string {
	const max = 1500
	if len(s) > max {
		return "..." + s[len(s)-max:]
	}
	return s
}

// within fails the test unless cond turns true within d.
func within(t *testing.T, d time.Duration, cond func() bool, format string, args ...any) {
	t.Helper()
	require.Eventually(t, cond, d, 10*time.Millisecond, fmt.Sprintf(format, args...))
}

package netns

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/node"
	"github.com/peerkv/peerkv/core/tier"
	"github.com/peerkv/peerkv/tests/faults"
)

// A host's peer: one node, its jobs in a faults.Ledger, its P2P lookups
// served from what it holds (faults.Node), driven by one command a line on
// stdin, each answered by one JSON line on stdout:
//
//	net CIDR GATEWAY                    configure eth0, open the node: {"ID"}
//	store KV N                          PD producer: store N rows for kv_request_id KV
//	load KV N HOST PORT WITHIN_MS       PD consumer: pull them: {"Reported","Success","Ms","WrongRows"}
//	loads N HOST PORT WITHIN_MS KV...   PD consumer: pull N rows of each KV, all submitted at once: [load's answer...]
//	hold NAME                           P2P source: hold key NAME
//	lookup NAME HOST PORT WITHIN_MS     P2P consumer: ask HOST:PORT for NAME until not RETRY: {"Result","Ms"}
//	stats                               the node's stats
//	ledger WITHIN_MS                    wait until every job is reported: {"Unreported","Problems","Submitted","Reported"}
//
// stdin closing shuts the node down. The node's log lines go to stderr.
// The host's region holds rowsEnv rows (default 256) of faults.RowLen.

const (
	rowsEnv         = "PEERKV_NETNS_ROWS"
	defaultPeerRows = 256
)

type peerHost struct {
	p      *faults.Node
	ledger *faults.Ledger
	nrows  int // rows in the region
	rows   int // next row to hand out, round robin
	seq    int // request id suffix
}

func runPeer() int {
	in := bufio.NewScanner(os.Stdin)
	out := json.NewEncoder(os.Stdout)
	var h *peerHost
	var stopPump func()
	for in.Scan() {
		f := strings.Fields(in.Text())
		if len(f) == 0 {
			continue
		}
		var v any
		var err error
		switch {
		case f[0] == "net" && h == nil && len(f) == 3:
			h, err = openPeer(f[1], f[2])
			if err == nil {
				stopPump = h.pump()
				v = map[string]string{"ID": h.p.LocalID()}
			}
		case h == nil:
			err = errors.New("no node yet: send net first")
		default:
			v, err = h.do(f)
		}
		reply := map[string]any{"value": v}
		if err != nil {
			reply = map[string]any{"error": err.Error()}
		}
		if err := out.Encode(reply); err != nil {
			break
		}
	}
	if h == nil {
		return 0
	}
	stopPump()
	if err := h.p.Shutdown(); err != nil {
		fmt.Fprintf(os.Stderr, "shutdown: %v\n", err)
		return 1
	}
	return 0
}

// openPeer waits for eth0 (the router moves it in), configures it and
// opens the node with the options in peerEnv.
func openPeer(cidr, gateway string) (*peerHost, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := net.InterfaceByName("eth0"); err == nil {
			break
		} else if time.Now().After(deadline) {
			return nil, fmt.Errorf("eth0 never appeared: %w", err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, args := range [][]string{
		{"link", "set", "lo", "up"}, {"addr", "add", cidr, "dev", "eth0"}, {"link", "set", "eth0", "up"},
		{"route", "add", "default", "via", gateway},
	} {
		if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
			return nil, fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	cfg, err := config.FromJSON([]byte(os.Getenv(peerEnv)))
	if err != nil {
		return nil, err
	}
	nrows := defaultPeerRows
	if s := os.Getenv(rowsEnv); s != "" {
		if nrows, err = strconv.Atoi(s); err != nil || nrows <= 0 {
			return nil, fmt.Errorf("%s=%q: not a positive number of rows", rowsEnv, s)
		}
	}
	// Anonymous mmap memory, as a host's region is: outside the Go heap,
	// where the race detector would see the data path's writes as races.
	mem, err := syscall.Mmap(-1, 0, nrows*faults.RowLen, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, err
	}
	region := data.Region{Mem: mem, RowLen: faults.RowLen}
	tr, err := node.Open(cfg, region)
	if err != nil {
		return nil, err
	}
	ledger := faults.NewLedger()
	return &peerHost{p: faults.Adopt(tr, region, ledger), ledger: ledger, nrows: nrows}, nil
}

// pump serves inbound lookups, collects finished jobs and copies log lines
// to stderr until the returned stop is called.
func (h *peerHost) pump() (stop func()) {
	quit := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			if err := h.p.Serve(); err != nil {
				fmt.Fprintf(os.Stderr, "serve: %v\n", err)
			}
			h.p.Collect()
			_, _ = os.Stderr.Write(h.p.TakeLogs(1 << 16))
			select {
			case <-quit:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}()
	return func() { close(quit); wg.Wait() }
}

func (h *peerHost) do(f []string) (any, error) {
	h.seq++
	switch {
	case f[0] == "store" && len(f) == 3:
		var n int
		if _, err := fmt.Sscan(f[2], &n); err != nil {
			return nil, err
		}
		return nil, h.store(f[1], n)
	case f[0] == "load" && len(f) == 6:
		var n, port, ms int
		if _, err := fmt.Sscan(f[2], &n); err != nil {
			return nil, err
		}
		if _, err := fmt.Sscan(f[4]+" "+f[5], &port, &ms); err != nil {
			return nil, err
		}
		return h.load(f[1], n, f[3], port, time.Duration(ms)*time.Millisecond)
	case f[0] == "loads" && len(f) >= 6:
		var n, port, ms int
		if _, err := fmt.Sscan(f[1]+" "+f[3]+" "+f[4], &n, &port, &ms); err != nil {
			return nil, err
		}
		return h.loads(f[5:], n, f[2], port, time.Duration(ms)*time.Millisecond)
	case f[0] == "hold" && len(f) == 2:
		h.p.Hold(faults.Key(f[1]), h.nextRows(1)[0])
		return nil, nil
	case f[0] == "lookup" && len(f) == 5:
		var port, ms int
		if _, err := fmt.Sscan(f[3]+" "+f[4], &port, &ms); err != nil {
			return nil, err
		}
		return h.lookup(f[1], f[2], port, time.Duration(ms)*time.Millisecond)
	case f[0] == "stats" && len(f) == 1:
		return h.p.Stats(), nil
	case f[0] == "ledger" && len(f) == 2:
		var ms int
		if _, err := fmt.Sscan(f[1], &ms); err != nil {
			return nil, err
		}
		return h.settle(time.Duration(ms) * time.Millisecond), nil
	}
	return nil, fmt.Errorf("unknown command %q", strings.Join(f, " "))
}

func (h *peerHost) nextRows(n int) []int64 {
	rows := make([]int64, n)
	for i := range rows {
		rows[i] = int64(h.rows % h.nrows)
		h.rows++
	}
	return rows
}

func rowKeys(kv string, n int) [][]byte {
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = faults.Key(fmt.Sprintf("%s/%d", kv, i))
	}
	return keys
}

func (h *peerHost) store(kv string, n int) error {
	req := fmt.Sprintf("p-%s-%d", kv, h.seq)
	if _, err := h.p.StartRequest(req, fmt.Appendf(nil, `{"remote_decoder":{"kv_request_id":%q}}`, kv)); err != nil {
		return err
	}
	keys, rows := rowKeys(kv, n), h.nextRows(n)
	for i, k := range keys {
		faults.Fill(h.p.Row(rows[i]), k)
	}
	if err := h.p.SubmitStoreJob(req, faults.NextJob(), keys, rows); err != nil {
		return err
	}
	return h.p.FinishRequest(req)
}

type loadResult struct {
	Reported, Success bool
	Ms                int64
	WrongRows         int   // rows of a successful load that do not hold their key's bytes
	SubmittedUnixNs   int64 // when it was submitted (the hosts share the router's clock)
}

func (h *peerHost) load(kv string, n int, host string, port int, within time.Duration) (loadResult, error) {
	r, err := h.loads([]string{kv}, n, host, port, within)
	if err != nil {
		return loadResult{}, err
	}
	return r[0], nil
}

// pdLoad is one load submitted, waiting for its report.
type pdLoad struct {
	req   string
	job   int64
	keys  [][]byte
	rows  []int64
	start time.Time
}

// loads submits a load of n rows for each kv id at once, then waits up to
// within (from its own submission) for each one's report.
func (h *peerHost) loads(kvs []string, n int, host string, port int, within time.Duration) ([]loadResult, error) {
	var started []pdLoad
	finish := func() error {
		var first error
		for _, l := range started {
			if err := h.p.FinishRequest(l.req); err != nil && first == nil {
				first = err
			}
		}
		return first
	}
	for _, kv := range kvs {
		l := pdLoad{req: fmt.Sprintf("d-%s-%d", kv, h.seq), job: faults.NextJob(), keys: rowKeys(kv, n), rows: h.nextRows(n)}
		params := fmt.Appendf(nil, `{"remote_prefiller":{"kv_request_id":%q,"remote_host":%q,"remote_port":%d}}`, kv, host, port)
		if _, err := h.p.StartRequest(l.req, params); err != nil {
			return nil, errors.Join(err, finish())
		}
		started = append(started, l)
		for _, r := range l.rows {
			faults.Poison(h.p.Row(r))
		}
	}
	// Submitted together, once every row is poisoned: their deadlines
	// start together.
	for i := range started {
		l := &started[i]
		l.start = time.Now()
		if err := h.p.SubmitLoadJob(l.req, l.job, l.keys, l.rows); err != nil {
			return nil, errors.Join(err, finish())
		}
	}
	out := make([]loadResult, len(started))
	for i, l := range started {
		res, reported := h.ledger.Wait(l.job, time.Until(l.start.Add(within)), nil) // pump collects
		if reported {
			at, _ := h.ledger.ReportedAt(l.job)
			out[i].Ms = at.Sub(l.start).Milliseconds()
		} else {
			out[i].Ms = time.Since(l.start).Milliseconds()
		}
		out[i].Reported, out[i].Success, out[i].SubmittedUnixNs = reported, res.Success, l.start.UnixNano()
		if res.Success {
			for j, r := range l.rows {
				if faults.Check(h.p.Row(r), l.keys[j]) != -1 {
					out[i].WrongRows++
				}
			}
		}
	}
	return out, finish()
}

type lookupResult struct {
	Result string // tier.LookupResult's name: HIT, MISS, or RETRY when still undecided after WITHIN_MS
	Ms     int64
}

// lookup asks as a host's scheduler does: the request's key each step,
// the lookups sent at the step's end, until the answer is not RETRY.
func (h *peerHost) lookup(name, host string, port int, within time.Duration) (lookupResult, error) {
	req := fmt.Sprintf("l-%s-%d", name, h.seq)
	params := fmt.Appendf(nil, `{"remote_kv_source":{"kv_request_id":%q,"remote_host":%q,"remote_port":%d}}`, "kv-"+req, host, port)
	if _, err := h.p.StartRequest(req, params); err != nil {
		return lookupResult{}, err
	}
	keys, got := [][]byte{faults.Key(name)}, make([]tier.LookupResult, 1)
	start := time.Now()
	res := lookupResult{Result: tier.Retry.String()}
	for time.Since(start) < within {
		if err := h.p.Lookup(req, keys, got); err != nil {
			return res, err
		}
		if err := h.p.OnScheduleEnd(); err != nil {
			return res, err
		}
		if got[0] != tier.Retry {
			res.Result = got[0].String()
			break
		}
		time.Sleep(2 * time.Millisecond)
	}
	res.Ms = time.Since(start).Milliseconds()
	return res, h.p.FinishRequest(req)
}

type ledgerState struct {
	Unreported, Problems []string
	Submitted, Reported  int
}

// settle waits up to within for every job to be reported.
func (h *peerHost) settle(within time.Duration) ledgerState {
	deadline := time.Now().Add(within)
	for len(h.ledger.Unreported()) > 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	s := ledgerState{Unreported: h.ledger.Unreported(), Problems: h.ledger.Problems()}
	s.Submitted, s.Reported = h.ledger.Counts()
	return s
}

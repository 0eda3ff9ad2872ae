// Command control measures the control plane on the real path (ZMQ over
// loopback, two peers in one process):
//
//   - lookup round trips per second, with p50/p99 latency: a consumer's
//     lookup of 16 keys, flushed by on_schedule_end, served by the producer's
//     host loop, answered, and visible to the consumer's next lookup;
//   - host-call cost per key of lookup, on_schedule_end and get_finished, the
//     calls vLLM's scheduler thread makes every step.
//
// Ratios and percentiles come from one run, so machine noise cancels out.
package main

import (
	"crypto/sha256"
	"encoding/binary"
	"flag"
	"fmt"
	"net"
	"os"
	"runtime"
	"sort"
	"time"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/node"
	"github.com/peerkv/peerkv/core/tier"
	"github.com/peerkv/peerkv/tests/bench/internal/benchproc"
)

const (
	rowLen  = 4096
	numRows = 1024
	keysPer = 16
)

func main() {
	rounds := flag.Int("rounds", 2000, "lookup round trips to time")
	flag.Parse()
	if err := run(*rounds); err != nil {
		fmt.Fprintln(os.Stderr, "control bench:", err)
		os.Exit(1)
	}
}

func open() (*tier.Tier, int, error) {
	port, err := benchproc.FreePort()
	if err != nil {
		return nil, 0, err
	}
	cfg := config.Config{Host: "127.0.0.1", Port: port, HashSeed: "bench", KeyLen: 36, Tick: time.Millisecond}.WithDefaults()
	t, err := node.Open(cfg, data.Region{Mem: make([]byte, numRows*rowLen), RowLen: rowLen})
	return t, port, err
}

func key(i int) []byte {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(i))
	h := sha256.Sum256(b[:])
	return append(h[:], 0, 0, 0, 0)
}

// heldEven is the producer's holdings: the even keys, each lookup's hits
// pinned at rows 0, 1, ...
func heldEven(k []byte, hitsBefore int) (int64, bool) {
	return int64(hitsBefore), k[0]%2 == 0
}

func run(rounds int) error {
	prod, _, err := open()
	if err != nil {
		return err
	}
	defer prod.Shutdown()
	cons, _, err := open()
	if err != nil {
		return err
	}
	defer cons.Shutdown()
	_, prodPort, _ := net.SplitHostPort(prod.LocalID())

	var pinJobs int64
	lat := make([]time.Duration, 0, rounds)
	out := make([]tier.LookupResult, keysPer)
	ks := make([][]byte, keysPer)
	begin := time.Now()
	for r := 0; r < rounds; r++ {
		req := fmt.Sprintf("req-%d", r)
		params := fmt.Sprintf(`{"remote_kv_source":{"kv_request_id":%q,"remote_host":"127.0.0.1","remote_port":%s}}`, req, prodPort)
		if _, err := cons.StartRequest(req, []byte(params)); err != nil {
			return err
		}
		for i := range ks {
			ks[i] = key(r*keysPer + i)
		}
		start := time.Now()
		deadline := start.Add(10 * time.Second)
		for {
			if err := cons.Lookup(req, ks, out); err != nil {
				return err
			}
			if out[0] != tier.Retry {
				break
			}
			_ = cons.OnScheduleEnd()
			_ = benchproc.ServeInbound(prod, heldEven, &pinJobs)
			// A host calls in from its own thread and holds no Go P between
			// calls; this loop is a goroutine, so it yields as that thread
			// would (spinning, it would hold the tier's goroutines back
			// until Go's 10 ms preemption).
			runtime.Gosched()
			if time.Now().After(deadline) {
				return fmt.Errorf("lookup %d got no answer within 10s", r)
			}
		}
		lat = append(lat, time.Since(start))
		_ = cons.FinishRequest(req)
		for prod.GetFinished(256) != nil {
		}
	}
	elapsed := time.Since(begin)
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	p := func(q float64) time.Duration { return lat[int(q*float64(len(lat)-1))] }
	fmt.Printf("control: lookup round trips (%d keys, ZMQ loopback, host loop included): %.0f/s; p50 %v; p99 %v\n",
		keysPer, float64(rounds)/elapsed.Seconds(), p(0.50).Round(time.Microsecond), p(0.99).Round(time.Microsecond))

	// Host-call cost: a P2P consumer request with answered probes.
	const n = 20000
	req := "cost"
	_, _ = cons.StartRequest(req, []byte(fmt.Sprintf(`{"remote_kv_source":{"kv_request_id":"cost","remote_host":"127.0.0.1","remote_port":%s}}`, prodPort)))
	pool := make([][]byte, 256)
	for i := range pool {
		pool[i] = key(1<<30 + i)
	}
	one := [][]byte{nil}
	res := make([]tier.LookupResult, 1)
	t0 := time.Now()
	for i := 0; i < n; i++ {
		one[0] = pool[i%len(pool)]
		_ = cons.Lookup(req, one, res)
	}
	perLookup := time.Since(t0) / n
	t0 = time.Now()
	for i := 0; i < n; i++ {
		_ = cons.OnScheduleEnd()
	}
	perEnd := time.Since(t0) / n
	t0 = time.Now()
	for i := 0; i < n; i++ {
		_ = cons.GetFinished(64)
	}
	perFinished := time.Since(t0) / n
	fmt.Printf("control: host-call cost: lookup %v/key; on_schedule_end %v/call; get_finished %v/call (Go API, no cgo)\n",
		perLookup, perEnd, perFinished)
	return nil
}

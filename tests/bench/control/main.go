// Command control measures the control plane on the real path (ZMQ over
// loopback, two peers in one process):
//
//   - lookup round trips per second, with p50/p99 latency: a consumer's
//     lookup of 16 keys, flushed by on_schedule_end, served by the producer's
//     host loop, answered, and visible to the consumer; once with a host
//     that spins (as vLLM's engine steps while a request waits), once with
//     a host that sleeps on the notification fds until there is work;
//   - host-call cost per key of lookup, on_schedule_end and get_finished, the
//     calls vLLM's scheduler thread makes every step.
//
// Ratios and percentiles come from one run, so machine noise cancels out.
package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"flag"
	"fmt"
	"net"
	"os"
	"runtime"
	"slices"
	"time"

	"golang.org/x/sys/unix"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/node"
	"github.com/peerkv/peerkv/core/tier"
	"github.com/peerkv/peerkv/tests/bench/internal/benchproc"
	"github.com/peerkv/peerkv/tests/hostsim"
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

// hostModel is how the bench's host loop waits between its calls.
type hostModel int

const (
	// spinning: a host that steps without pause while a request waits, as
	// vLLM's engine does, asking per key (peerkv_lookup).
	spinning hostModel = iota
	// woken: a host that caches answers (LookupMany, TakeAnswers) and sleeps
	// on both peers' notification fds between calls, as a C embedder or
	// vLLM's engine-wake thread does: no CPU of its own while it waits.
	woken
)

func (h hostModel) String() string {
	if h == spinning {
		return "host spinning, per-key lookups"
	}
	return "host woken by the notification fd, cached answers"
}

func pct(lat []time.Duration, q float64) time.Duration {
	return lat[int(q*float64(len(lat)-1))].Round(time.Microsecond)
}

// roundTrips times rounds lookups of keysPer keys, each from StartRequest
// to the last answer, with the host loop h; timeouts counts the woken
// host's waits that no signal ended.
func roundTrips(prod, cons *tier.Tier, prodPort string, rounds int, h hostModel) (lat []time.Duration, perSec float64, timeouts int, err error) {
	var fds []unix.PollFd
	if h == woken {
		for _, t := range []*tier.Tier{prod, cons} {
			fd, err := t.NotifyFD()
			if err != nil {
				return nil, 0, 0, err
			}
			fds = append(fds, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
		}
	}
	pins := hostsim.Count(new(int64))
	var seen uint64
	buf := make([]byte, 8)
	lat = make([]time.Duration, 0, rounds)
	out := make([]tier.LookupResult, keysPer)
	ks := make([][]byte, keysPer)
	begin := time.Now()
	for r := 0; r < rounds; r++ {
		req := fmt.Sprintf("%v-%d", int(h), r)
		params := fmt.Sprintf(`{"remote_kv_source":{"kv_request_id":%q,"remote_host":"127.0.0.1","remote_port":%s}}`, req, prodPort)
		if _, err := cons.StartRequest(req, []byte(params)); err != nil {
			return nil, 0, 0, err
		}
		for i := range ks {
			ks[i] = key(int(h)<<24 + r*keysPer + i)
		}
		start := time.Now()
		deadline := start.Add(10 * time.Second)
		if h == woken {
			if cons.LookupMode(req) != tier.LookupsAsk {
				return nil, 0, 0, fmt.Errorf("request %s does not cache answers", req)
			}
			if err := cons.LookupMany([]tier.RequestKeys{{ReqID: req, Keys: bytes.Join(ks, nil)}}, len(ks[0]), out); err != nil {
				return nil, 0, 0, err
			}
		}
		for left := keysPer; left > 0; {
			switch h {
			case spinning:
				if err := cons.Lookup(req, ks, out); err != nil {
					return nil, 0, 0, err
				}
				if out[0] != tier.Retry {
					left = 0
					continue
				}
				_ = cons.OnScheduleEnd()
				_, _ = hostsim.Serve(prod, heldEven, pins)
				// A host calls in from its own thread and holds no Go P between
				// calls; this loop is a goroutine, so it yields as that thread
				// would (spinning, it would hold the tier's goroutines back
				// until Go's 10 ms preemption).
				runtime.Gosched()
			case woken:
				_ = cons.OnScheduleEnd()
				if !wait(fds, buf, 10) {
					timeouts++
				}
				_, _ = hostsim.Serve(prod, heldEven, pins)
				if n := cons.News(tier.NewsAnswers); n != seen {
					seen = n
					for _, c := range cons.TakeAnswers(func(tier.AnswerChange) bool { return true }) {
						for i, pos := range c.Positions {
							if c.Results[i] != tier.Retry && out[pos] == tier.Retry {
								left--
							}
							out[pos] = c.Results[i]
						}
					}
				}
			}
			if time.Now().After(deadline) {
				return nil, 0, 0, fmt.Errorf("lookup %s got no answer within 10s", req)
			}
		}
		lat = append(lat, time.Since(start))
		_ = cons.FinishRequest(req)
		for prod.GetFinished(256) != nil {
		}
		if fds != nil {
			wait(fds, buf, 0) // the pin jobs' results, collected above
		}
	}
	perSec = float64(rounds) / time.Since(begin).Seconds()
	slices.Sort(lat)
	return lat, perSec, timeouts, nil
}

// wait polls fds up to ms and reads those that are readable (resetting
// them), reporting whether any was.
func wait(fds []unix.PollFd, buf []byte, ms int) bool {
	n, _ := unix.Poll(fds, ms)
	for _, f := range fds {
		if f.Revents&unix.POLLIN != 0 {
			_, _ = unix.Read(int(f.Fd), buf)
		}
	}
	return n > 0
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

	for _, h := range []hostModel{spinning, woken} {
		lat, perSec, timeouts, err := roundTrips(prod, cons, prodPort, rounds, h)
		if err != nil {
			return err
		}
		fmt.Printf("control: lookup round trips (%d keys, ZMQ loopback, host loop included), %s: %.0f/s; p50 %v; p99 %v",
			keysPer, h, perSec, pct(lat, 0.50), pct(lat, 0.99))
		if h == woken { // a wake-up the library owed and did not give shows here
			fmt.Printf("; %d waits ended by their 10 ms timeout", timeouts)
		}
		fmt.Println()
	}

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

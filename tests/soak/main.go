// Command soak runs PD and P2P requests between three in-process peers
// (memctl + memdata) from several goroutines, with random faults from
// tests/faults' Wire (frames dropped, duplicated, reordered or late), the
// occasional failing data path and producer restart, checking that every
// job is reported exactly once and every successful load has the
// producer's bytes. It then checks that the peers went quiet and that
// goroutines and heap did not grow. Exit status 1 on any failure.
//
//	go run ./tests/soak [-requests N] [-duration D]
package main

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/peerkv/peerkv/tests/faults"
)

const (
	goroutineSlack = 10
	heapSlack      = 16 << 20
)

func main() {
	requests := flag.Int("requests", 10000, "requests to run")
	duration := flag.Duration("duration", 9*time.Minute, "stop after this long at most")
	workers := flag.Int("workers", 8, "goroutines issuing requests")
	seed := flag.Uint64("seed", 1, "random seed (faults, choices)")
	restartEvery := flag.Duration("restart-every", 3*time.Second, "restart a random peer this often")
	flag.Parse()
	os.Exit(run(*requests, *duration, *workers, *seed, *restartEvery))
}

func run(requests int, duration time.Duration, workers int, seed uint64, restartEvery time.Duration) int {
	s := &soak{c: faults.NewCluster(), workers: workers, seed: seed}
	for _, port := range []int{7101, 7102, 7103} {
		n := &node{port: port, applied: map[faults.Action]int{}}
		if err := s.start(n); err != nil {
			fmt.Println("soak: open peer:", err)
			return 1
		}
		s.nodes = append(s.nodes, n)
	}
	start := measure()
	fmt.Printf("soak: seed %d, %d workers, %d requests or %v at most, 3 peers\n", seed, workers, requests, duration)
	fmt.Printf("start: %s\n", start)

	var c counts
	began := time.Now()
	deadline := began.Add(duration)
	var budget atomic.Int64
	budget.Store(int64(requests))
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() { defer wg.Done(); s.worker(w, &budget, deadline, &c) }()
	}
	stopChaos := make(chan struct{})
	chaosDone := make(chan struct{})
	go func() { defer close(chaosDone); s.chaos(stopChaos, restartEvery, &c) }()
	wg.Wait()
	close(stopChaos)
	<-chaosDone
	elapsed := time.Since(began)

	unsettled := s.calm(15 * time.Second)
	s.c.Ledger.Compact(0)
	end := measure()
	submitted, reported := s.c.Ledger.Counts()
	dups := s.c.Ledger.Problems()
	fmt.Printf("end:   %s\n", end)
	fmt.Printf("ran %v: requests %d (pd %d, p2p %d), loads ok %d failed %d, no load %d, wrong bytes %d, false hits %d, "+
		"duplicate/unknown reports %d, missing reports %d, jobs submitted %d reported %d\n",
		elapsed.Round(time.Millisecond), c.requests.Load(), c.pd.Load(), c.p2p.Load(), c.loadsOK.Load(),
		c.loadsFailed.Load(), c.noLoad.Load(), c.wrongBytes.Load(), c.falseHits.Load(), len(dups), c.missing.Load(),
		submitted, reported)
	fmt.Printf("faults: dropped %d, duplicated %d, reordered %d, delayed %d frames; data path failing %d times; %d restarts\n",
		s.applied(faults.Drop), s.applied(faults.Duplicate), s.applied(faults.Reorder), s.applied(faults.Delay),
		c.setFails.Load(), c.restarts.Load())

	failed := false
	fail := func(format string, args ...any) { failed = true; fmt.Printf("FAIL: "+format+"\n", args...) }
	if n := c.wrongBytes.Load(); n > 0 {
		fail("%d loads reported successful with wrong bytes", n)
	}
	if n := c.falseHits.Load(); n > 0 {
		fail("%d keys answered HIT that the producer does not hold", n)
	}
	if len(dups) > 0 {
		fail("%d duplicate or unknown reports, first: %s", len(dups), dups[0])
	}
	if n := c.missing.Load(); n > 0 {
		fail("%d jobs or lookups not answered within their bounds", n)
	}
	if submitted != reported {
		fail("%d jobs never reported", submitted-reported)
	}
	if len(unsettled) > 0 {
		fail("not quiet after the run: %v", unsettled)
	}
	if n := s.hostErr.Load(); n > 0 {
		fail("%d host serve-pass errors, last: %s", n, *s.lastErr.Load())
	}
	if p := c.firstProblem.Load(); p != nil {
		fmt.Println("first problem:", *p)
	}
	if end.goroutines > start.goroutines+goroutineSlack {
		fail("goroutines grew from %d to %d", start.goroutines, end.goroutines)
	}
	if end.heap > 2*start.heap+heapSlack {
		fail("heap grew from %d to %d bytes", start.heap, end.heap)
	}
	for _, n := range s.nodes {
		_ = s.retire(n)
	}
	if failed {
		return 1
	}
	fmt.Println("soak: PASS")
	return 0
}

// chaos fails a random peer's data path for a moment every 2 s and
// restarts a random peer every restartEvery.
func (s *soak) chaos(stop chan struct{}, restartEvery time.Duration, c *counts) {
	rng := rand.New(rand.NewPCG(s.seed, 0xc4a05))
	tick := time.NewTicker(2 * time.Second)
	defer tick.Stop()
	nextRestart := time.Now().Add(restartEvery)
	nextPrint := time.Now().Add(10 * time.Second)
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		s.c.Ledger.Compact(30 * time.Second)
		n := s.nodes[rng.IntN(len(s.nodes))]
		n.mu.RLock()
		id := n.peer.ID
		n.mu.RUnlock()
		s.c.Data.SetFail(id, true)
		c.setFails.Add(1)
		time.Sleep(20 * time.Millisecond)
		s.c.Data.SetFail(id, false)
		if restartEvery > 0 && time.Now().After(nextRestart) {
			nextRestart = time.Now().Add(restartEvery)
			if err := s.restart(s.nodes[rng.IntN(len(s.nodes))]); err != nil {
				c.problem("restart: %v", err)
			}
			c.restarts.Add(1)
		}
		if time.Now().After(nextPrint) {
			nextPrint = time.Now().Add(10 * time.Second)
			fmt.Printf("  %d requests, loads ok %d failed %d, wrong bytes %d, missing %d\n",
				c.requests.Load(), c.loadsOK.Load(), c.loadsFailed.Load(), c.wrongBytes.Load(), c.missing.Load())
		}
	}
}

// figures are the process's footprint.
type figures struct {
	rss        int64
	goroutines int
	heap       uint64
}

func (f figures) String() string {
	return fmt.Sprintf("RSS %.1f MiB, goroutines %d, heap after GC %.1f MiB",
		float64(f.rss)/(1<<20), f.goroutines, float64(f.heap)/(1<<20))
}

// measure collects garbage twice (finalizers run in between), then reads
// the heap, the goroutine count and the RSS (/proc/self/statm).
func measure() figures {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	f := figures{goroutines: runtime.NumGoroutine(), heap: ms.HeapAlloc}
	if b, err := os.ReadFile("/proc/self/statm"); err == nil {
		var size, resident int64
		if _, err := fmt.Sscanf(string(b), "%d %d", &size, &resident); err == nil {
			f.rss = resident * int64(os.Getpagesize())
		}
	}
	return f
}

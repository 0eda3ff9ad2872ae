package main

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/peerkv/peerkv/tests/faults"
)

// Region layout of every node: the keys its host holds for P2P, then per
// worker the rows it prefills (as a producer) and the slots it loads into
// (as a consumer). Each worker owns its rows, so workers never share one.
const (
	heldRows  = 64
	perWorker = 8
)

func regionRows(workers int) int { return heldRows + 2*workers*perWorker }

func prefillRow(w, i int) int64 { return int64(heldRows + w*perWorker + i) }

func slotRow(workers, w, i int) int64 { return int64(heldRows + workers*perWorker + w*perWorker + i) }

// heldKey is the i-th key node port's host holds at row i.
func heldKey(port, i int) []byte { return faults.Key(fmt.Sprintf("held/%d/%d", port, i)) }

// node is one peer's slot in the cluster; its incarnation changes on restart.
type node struct {
	port int
	// mu is held shared by every request using the peer, exclusively by a
	// restart, so a restart waits for them and the peer never changes mid-request.
	mu   sync.RWMutex
	peer *faults.Node
	stop chan struct{}
	host sync.WaitGroup
	// applied counts faults of incarnations already gone.
	applied map[faults.Action]int
}

// soak is the run's shared state.
type soak struct {
	c       *faults.Cluster
	nodes   []*node
	workers int
	seed    uint64
	seq     atomic.Uint64
	hostErr atomic.Int64
	lastErr atomic.Pointer[string]
}

// faultRules are the random faults every wire applies: a small fraction of
// frames dropped, duplicated, reordered or late (well inside, or past, the
// 2 s deadlines).
func faultRules() []faults.Rule {
	return []faults.Rule{
		{Dir: faults.In | faults.Out, Action: faults.Drop, Prob: 0.002},
		{Dir: faults.Out, Action: faults.Duplicate, Prob: 0.002},
		{Dir: faults.In, Action: faults.Reorder, Prob: 0.003, Delay: 100 * time.Millisecond},
		{Dir: faults.In, Action: faults.Delay, Prob: 0.005, Delay: 50 * time.Millisecond},
		{Dir: faults.In, Action: faults.Delay, Prob: 0.0005, Delay: 2500 * time.Millisecond},
	}
}

// start opens n's next incarnation and its host goroutines.
func (s *soak) start(n *node) error {
	p, err := s.c.Open(n.port, regionRows(s.workers), s.seed+s.seq.Add(1))
	if err != nil {
		return err
	}
	for i := range heldRows {
		p.Hold(heldKey(n.port, i), int64(i))
	}
	p.Wire.Set(faultRules()...)
	n.peer, n.stop = p, make(chan struct{})
	n.host.Add(1)
	go s.serve(n.peer, n.stop, &n.host)
	return nil
}

// serve is the host's loop for one incarnation: serve passes and job
// collection, every millisecond.
func (s *soak) serve(p *faults.Node, stop chan struct{}, wg *sync.WaitGroup) {
	defer wg.Done()
	for {
		if err := p.Serve(); err != nil {
			s.hostErr.Add(1)
			msg := err.Error()
			s.lastErr.Store(&msg)
		}
		p.Collect()
		select {
		case <-stop:
			return
		case <-time.After(time.Millisecond):
		}
	}
}

// retire stops n's incarnation: host loop, then shutdown (which reports
// every job still held), then the last collection.
func (s *soak) retire(n *node) error {
	close(n.stop)
	n.host.Wait()
	for _, a := range []faults.Action{faults.Drop, faults.Duplicate, faults.Reorder, faults.Delay} {
		n.applied[a] += n.peer.Wire.Applied(a)
	}
	err := n.peer.Shutdown()
	n.peer.Collect()
	return err
}

// restart replaces n's peer by a fresh one on the same id.
func (s *soak) restart(n *node) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if err := s.retire(n); err != nil {
		return err
	}
	return s.start(n)
}

// applied sums a fault over every incarnation of every node.
func (s *soak) applied(a faults.Action) int {
	total := 0
	for _, n := range s.nodes {
		n.mu.RLock()
		total += n.applied[a] + n.peer.Wire.Applied(a)
		n.mu.RUnlock()
	}
	return total
}

// calm turns the faults off and waits (bounded) until no frame is held or
// delayed, every job is reported and every peer is quiet.
func (s *soak) calm(within time.Duration) []string {
	for _, n := range s.nodes {
		n.peer.Wire.Clear()
		s.c.Data.SetFail(n.peer.ID, false)
	}
	deadline := time.Now().Add(within)
	for {
		var why []string
		for _, n := range s.nodes {
			if k := n.peer.Wire.Pending(); k > 0 {
				why = append(why, fmt.Sprintf("%s: %d frames still delayed", n.peer.ID, k))
			}
			if q := n.peer.Quiet(); q != "" {
				why = append(why, q)
			}
		}
		why = append(why, s.c.Ledger.Unreported()...)
		if len(why) == 0 || time.Now().After(deadline) {
			return why
		}
		time.Sleep(5 * time.Millisecond)
	}
}

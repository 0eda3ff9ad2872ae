package main

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/peerkv/peerkv/core/tier"
	"github.com/peerkv/peerkv/tests/faults"
)

// Bounds from faults.Config's deadlines; a job not reported within its
// bound is a missing report.
const (
	loadBound  = 2*time.Second + time.Second + 2*time.Second // load + abort-ack + slack
	storeBound = 3*time.Second + 3*time.Second + 2*time.Second
	probeBound = 2*time.Second + 2*time.Second + 2*time.Second
)

// counts are the run's figures.
type counts struct {
	requests, pd, p2p     atomic.Int64
	loadsOK, loadsFailed  atomic.Int64
	noLoad                atomic.Int64 // P2P all MISS, or the session failed before the load
	wrongBytes, falseHits atomic.Int64
	missing, refused      atomic.Int64
	restarts, setFails    atomic.Int64
	firstProblem          atomic.Pointer[string]
}

func (c *counts) problem(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	c.firstProblem.CompareAndSwap(nil, &msg)
}

// worker runs requests until the budget or the deadline is spent.
func (s *soak) worker(w int, budget *atomic.Int64, deadline time.Time, c *counts) {
	rng := rand.New(rand.NewPCG(s.seed, uint64(w)))
	for budget.Add(-1) >= 0 && time.Now().Before(deadline) {
		i := rng.IntN(len(s.nodes))
		j := (i + 1 + rng.IntN(len(s.nodes)-1)) % len(s.nodes)
		prod, cons := s.nodes[i], s.nodes[j]
		first, second := prod, cons
		if j < i { // shared locks in index order
			first, second = cons, prod
		}
		first.mu.RLock()
		second.mu.RLock()
		c.requests.Add(1)
		if rng.IntN(2) == 0 {
			c.pd.Add(1)
			s.pd(w, rng, prod, cons, c)
		} else {
			c.p2p.Add(1)
			s.p2p(w, rng, prod, cons, c)
		}
		second.mu.RUnlock()
		first.mu.RUnlock()
	}
}

// pd: the prefiller stores n rows under remote_decoder (before or after
// the decoder asks), the decoder pulls them.
func (s *soak) pd(w int, rng *rand.Rand, prodN, consN *node, c *counts) {
	prod, cons := prodN.peer, consN.peer
	kv := fmt.Sprintf("pd-%d-%d", w, s.seq.Add(1))
	n := 1 + rng.IntN(perWorker)
	keys := keysFor(kv, n)
	store := int64(-1)
	prefill := func() {
		req := "p-" + kv
		if _, err := prod.StartRequest(req, fmt.Appendf(nil, `{"remote_decoder":{"kv_request_id":%q}}`, kv)); err != nil {
			c.problem("%s StartRequest: %v", prod.ID, err)
			return
		}
		rows := make([]int64, n)
		for i := range rows {
			rows[i] = prefillRow(w, i)
			faults.Fill(prod.Row(rows[i]), keys[i])
		}
		store = faults.NextJob()
		if err := prod.SubmitStoreJob(req, store, keys, rows); err != nil {
			c.problem("%s SubmitStore: %v", prod.ID, err)
			store = -1
		}
		_ = prod.FinishRequest(req)
	}
	if rng.IntN(2) == 0 {
		prefill()
	}
	req := "d-" + kv
	if !s.startConsumer(cons, req, remote("remote_prefiller", kv, prod), c) {
		return
	}
	res := make([]tier.LookupResult, n)
	_ = cons.Lookup(req, keys, res)
	load := int64(-1)
	var slots []int64
	if res[0] == tier.Hit {
		load, slots = s.submitLoad(w, cons, req, keys, c)
	} else {
		c.noLoad.Add(1)
	}
	if store < 0 {
		prefill()
	}
	s.awaitLoad(cons, load, slots, keys, c)
	_ = cons.FinishRequest(req)
	s.await(store, storeBound, "store", c) // its rows are reused next
}

// p2p: the consumer looks up three keys the producer's host holds and one
// it does not, and pulls the hits.
func (s *soak) p2p(w int, rng *rand.Rand, prodN, consN *node, c *counts) {
	prod, cons := prodN.peer, consN.peer
	kv := fmt.Sprintf("p2p-%d-%d", w, s.seq.Add(1))
	keys := make([][]byte, 0, 4)
	for _, i := range rng.Perm(heldRows)[:3] {
		keys = append(keys, heldKey(prodN.port, i))
	}
	keys = append(keys, faults.Key("miss/"+kv))
	rng.Shuffle(len(keys), func(a, b int) { keys[a], keys[b] = keys[b], keys[a] })
	req := "c-" + kv
	if !s.startConsumer(cons, req, remote("remote_kv_source", kv, prod), c) {
		return
	}
	res := make([]tier.LookupResult, len(keys))
	deadline := time.Now().Add(probeBound)
	for {
		_ = cons.Lookup(req, keys, res)
		_ = cons.OnScheduleEnd()
		if !slices.Contains(res, tier.Retry) {
			break
		}
		if time.Now().After(deadline) {
			c.missing.Add(1)
			c.problem("%s: lookups of %s still RETRY after %v", cons.ID, kv, probeBound)
			break
		}
		time.Sleep(time.Millisecond)
	}
	var hits [][]byte
	for i, r := range res {
		if r == tier.Hit {
			if !prod.Holds(keys[i]) {
				c.falseHits.Add(1)
				c.problem("%s: key of %s answered HIT, not held by %s", cons.ID, kv, prod.ID)
				continue
			}
			hits = append(hits, keys[i])
		}
	}
	if len(hits) == 0 {
		c.noLoad.Add(1)
		_ = cons.FinishRequest(req)
		return
	}
	load, slots := s.submitLoad(w, cons, req, hits, c)
	s.awaitLoad(cons, load, slots, hits, c)
	_ = cons.FinishRequest(req)
}

func (s *soak) startConsumer(cons *faults.Node, req string, params []byte, c *counts) bool {
	if _, err := cons.StartRequest(req, params); err != nil {
		c.problem("%s StartRequest %s: %v", cons.ID, req, err)
		return false
	}
	return true
}

// submitLoad loads keys into the worker's slots, poisoned first.
func (s *soak) submitLoad(w int, cons *faults.Node, req string, keys [][]byte, c *counts) (int64, []int64) {
	slots := make([]int64, len(keys))
	for i := range slots {
		slots[i] = slotRow(s.workers, w, i)
		faults.Poison(cons.Row(slots[i]))
	}
	job := faults.NextJob()
	if err := cons.SubmitLoadJob(req, job, keys, slots); err != nil {
		if !errors.Is(err, tier.ErrClosed) {
			c.problem("%s SubmitLoad: %v", cons.ID, err)
		}
		c.refused.Add(1)
		return -1, nil
	}
	return job, slots
}

// awaitLoad waits for a load's single report and checks every byte of a
// success.
func (s *soak) awaitLoad(cons *faults.Node, job int64, slots []int64, keys [][]byte, c *counts) {
	r, ok := s.await(job, loadBound, "load", c)
	if !ok {
		return
	}
	if !r.Success {
		c.loadsFailed.Add(1)
		return
	}
	c.loadsOK.Add(1)
	for i, slot := range slots {
		if off := faults.Check(cons.Row(slot), keys[i]); off >= 0 {
			c.wrongBytes.Add(1)
			c.problem("%s: load %d reported successful, slot %d wrong at offset %d", cons.ID, job, slot, off)
			return
		}
	}
}

func (s *soak) await(job int64, within time.Duration, what string, c *counts) (tier.JobResult, bool) {
	if job < 0 {
		return tier.JobResult{}, false
	}
	r, ok := s.c.Ledger.Wait(job, within, nil)
	if !ok {
		c.missing.Add(1)
		c.problem("%s job %d not reported within %v", what, job, within)
	}
	return r, ok
}

func keysFor(kv string, n int) [][]byte {
	out := make([][]byte, n)
	for i := range out {
		out[i] = faults.Key(kv + "/" + strconv.Itoa(i))
	}
	return out
}

func remote(role, kv string, prod *faults.Node) []byte {
	port := prod.ID[strings.LastIndexByte(prod.ID, ':')+1:]
	return fmt.Appendf(nil, `{%q:{"kv_request_id":%q,"remote_host":"127.0.0.1","remote_port":%s}}`, role, kv, port)
}

package faults

import (
	"slices"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/protocol"
	"github.com/peerkv/peerkv/core/tier"
)

// pull is what one consumer request came to.
type pull struct {
	loaded bool      // a load was submitted (P2P: some key was a HIT)
	ok     bool      // and it was reported successful
	start  time.Time // when the load was submitted
	took   time.Duration
	job    int64
	slots  []int64
	keys   [][]byte
}

// run is one clean-path request of mode ("pd" or "p2p").
func (e *env) run(mode string, prod, cons *Node) pull {
	if mode == "pd" {
		kv := uniq("pd")
		keys := keysFor(kv, 4)
		e.prefill(prod, kv, keys)
		return e.decode(prod, cons, kv, keys)
	}
	return e.p2p(prod, cons)
}

// prefill plays the prefiller: rows filled with the keys' pattern, stored
// under remote_decoder kv, request finished. It returns the store job and
// its rows.
func (e *env) prefill(prod *Node, kv string, keys [][]byte) (int64, []int64) {
	req := "p-" + kv
	_, err := prod.StartRequest(req, decoderParams(kv))
	require.NoError(e.t, err)
	rows := e.rows(prod, len(keys))
	for i, k := range keys {
		Fill(prod.Row(rows[i]), k)
	}
	job := NextJob()
	require.NoError(e.t, prod.SubmitStoreJob(req, job, keys, rows))
	require.NoError(e.t, prod.FinishRequest(req))
	return job, rows
}

// decode plays the PD decoder pulling keys of kv from prod.
func (e *env) decode(prod, cons *Node, kv string, keys [][]byte) pull {
	req := "d-" + kv
	_, err := cons.StartRequest(req, prefillerParams(kv, prod))
	require.NoError(e.t, err)
	res := make([]tier.LookupResult, len(keys))
	require.NoError(e.t, cons.Lookup(req, keys, res))
	if res[0] != tier.Hit { // the session could not even start
		require.NoError(e.t, cons.FinishRequest(req))
		return pull{}
	}
	return e.load(cons, req, keys)
}

// p2p plays a remote_kv_source consumer: prod holds three of four keys;
// the lookups go out in two steps, so two are in flight at once.
func (e *env) p2p(prod, cons *Node) pull {
	kv := uniq("p2p")
	keys := keysFor(kv, 4)
	rows := e.rows(prod, 3)
	for i, k := range [][]byte{keys[0], keys[1], keys[3]} {
		prod.Hold(k, rows[i])
	}
	req := "c-" + kv
	_, err := cons.StartRequest(req, sourceParams(kv, prod))
	require.NoError(e.t, err)
	res := e.probe(cons, req, keys)
	var hits [][]byte
	for i, r := range res {
		if r == tier.Hit {
			require.True(e.t, prod.Holds(keys[i]), "key %d is a HIT the producer never held", i)
			hits = append(hits, keys[i])
		}
	}
	if len(hits) == 0 {
		require.NoError(e.t, cons.FinishRequest(req))
		return pull{}
	}
	return e.load(cons, req, hits)
}

// probe looks keys up until none is RETRY: the first half alone until
// its lookup went out, so that two lookups are in flight at once.
func (e *env) probe(cons *Node, req string, keys [][]byte) []tier.LookupResult {
	sent := cons.Wire.Seen(Out, protocol.TypeLookup)
	half := make([]tier.LookupResult, len(keys)/2)
	e.eventually(func() bool {
		if cons.Lookup(req, keys[:len(half)], half) != nil || cons.OnScheduleEnd() != nil {
			return false
		}
		return cons.Wire.Seen(Out, protocol.TypeLookup) > sent || !slices.Contains(half, tier.Retry)
	}, probeBound, says("the first lookup never went out"))
	out := make([]tier.LookupResult, len(keys))
	var last []tier.LookupResult
	e.eventually(func() bool {
		res := make([]tier.LookupResult, len(keys))
		if cons.Lookup(req, keys, res) != nil || cons.OnScheduleEnd() != nil {
			return false
		}
		last = res
		return !slices.Contains(res, tier.Retry)
	}, probeBound, func() string { return "lookups still RETRY: " + fmtResults(last) })
	copy(out, last)
	return out
}

// load submits a load of keys for req into fresh (poisoned) slots, waits
// for its report, checks every byte of a success and finishes req.
func (e *env) load(cons *Node, req string, keys [][]byte) pull {
	p := e.submitLoad(cons, req, keys)
	p = e.settle(cons, p, e.wait(p.job, loadBound))
	require.NoError(e.t, cons.FinishRequest(req))
	return p
}

func (e *env) submitLoad(cons *Node, req string, keys [][]byte) pull {
	slots := e.rows(cons, len(keys))
	for _, s := range slots {
		Poison(cons.Row(s))
	}
	p := pull{loaded: true, job: NextJob(), slots: slots, keys: keys, start: time.Now()}
	require.NoError(e.t, cons.SubmitLoadJob(req, p.job, keys, slots))
	return p
}

// settle records a load's report and checks the rows of a success.
func (e *env) settle(cons *Node, p pull, r tier.JobResult) pull {
	p.took = time.Since(p.start)
	p.ok = r.Success
	require.True(e.t, r.IsLoad)
	if p.ok {
		e.checkRows(cons, p.slots, p.keys)
	}
	return p
}

// checkRows fails on any byte of slots that is not its key's pattern.
func (e *env) checkRows(cons *Node, slots []int64, keys [][]byte) {
	e.t.Helper()
	for i, s := range slots {
		off := Check(cons.Row(s), keys[i])
		require.Equal(e.t, -1, off, "wrong bytes: %s slot %d (key %d) differs at offset %d", cons.ID, s, i, off)
	}
}

// checkUntouched fails unless slots still hold only the sentinel.
func (e *env) checkUntouched(cons *Node, slots []int64) {
	e.t.Helper()
	for _, s := range slots {
		require.True(e.t, Poisoned(cons.Row(s)), "%s slot %d was written after its load was reported", cons.ID, s)
	}
}

func fmtResults(rs []tier.LookupResult) string {
	out := "["
	for i, r := range rs {
		if i > 0 {
			out += " "
		}
		out += r.String()
	}
	return out + "]"
}

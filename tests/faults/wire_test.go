package faults

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/protocol"
	"github.com/peerkv/peerkv/core/tier"
)

// wireCase is one wire message type, who sends it and the flow in which
// it travels.
type wireCase struct {
	typ     protocol.Type
	from    string // "producer" or "consumer"
	flow    string // "basic", "abort" (the host aborts a load) or "restart"
	p2pOnly bool
}

var wireCases = []wireCase{
	{typ: protocol.TypeConnect, from: "consumer", flow: "basic"},
	{typ: protocol.TypeConnect, from: "producer", flow: "basic"},
	{typ: protocol.TypeConnectAck, from: "consumer", flow: "basic"},
	{typ: protocol.TypeConnectAck, from: "producer", flow: "basic"},
	{typ: protocol.TypeLookup, from: "consumer", flow: "basic", p2pOnly: true},
	{typ: protocol.TypeLookupResp, from: "producer", flow: "basic", p2pOnly: true},
	{typ: protocol.TypeFetch, from: "consumer", flow: "basic"},
	{typ: protocol.TypeTransferDone, from: "producer", flow: "basic"},
	{typ: protocol.TypeAbortFetch, from: "consumer", flow: "abort"},
	{typ: protocol.TypeAbortAck, from: "producer", flow: "abort"},
	{typ: protocol.TypeDisconnect, from: "producer", flow: "restart"},
}

var wireActions = []Action{Drop, Duplicate, Reorder, Delay}

// want is a basic flow's expected outcome: "ok", "fail" or "any".
func (wc wireCase) want(act Action) string {
	switch {
	case wc.flow != "basic":
		return "any" // checked by the flow itself
	case (wc.typ == protocol.TypeLookup || wc.typ == protocol.TypeLookupResp) && (act == Drop || act == Delay):
		// The first batch (keys 0 and 1) goes unanswered past lookup_timeout_s:
		// key 0 is MISS, which ends the prefix, so nothing is pulled.
		return "fail"
	case wc.typ == protocol.TypeLookup || wc.typ == protocol.TypeLookupResp:
		return "ok"
	case act == Drop || act == Delay:
		return "fail" // every other frame of the flow is needed before a 2 s deadline
	case act == Duplicate && wc.typ == protocol.TypeConnect:
		return "fail" // a second connect is a protocol error
	case act == Duplicate && wc.typ == protocol.TypeFetch:
		return "any" // a second fetch is a protocol error unless the round already ended
	case act == Reorder && wc.typ == protocol.TypeConnect && wc.from == "producer":
		return "fail" // its connect_ack then comes before its connect
	}
	return "ok"
}

// TestWireFaults: each message type dropped, duplicated, reordered or
// late, once, in PD and P2P. Whatever the request comes to, its jobs are
// reported once within their deadlines, no wrong byte lands, the peers
// end quiet and a next request with faults off succeeds.
func TestWireFaults(t *testing.T) {
	for _, mode := range []string{"pd", "p2p"} {
		for _, wc := range wireCases {
			if wc.p2pOnly && mode == "pd" {
				continue
			}
			for _, act := range wireActions {
				t.Run(fmt.Sprintf("%s/%s_from_%s/%s", mode, wc.typ, wc.from, act), func(t *testing.T) {
					t.Parallel()
					runWireCase(t, mode, wc, act)
				})
			}
		}
	}
}

func runWireCase(t *testing.T, mode string, wc wireCase, act Action) {
	e := newEnv(t)
	prod, cons := e.open(prodPort), e.open(consPort)
	sender, receiver := cons, prod
	if wc.from == "producer" {
		sender, receiver = prod, cons
	}
	// Drops and duplicates happen as the sender sends, reorders and delays
	// as the receiver receives: both directions of the Wire are used.
	rule := Rule{Types: []protocol.Type{wc.typ}, Action: act, Times: 1, Dir: Out}
	target := sender
	if act == Reorder || act == Delay {
		rule.Dir, target = In, receiver
	}
	if act == Delay {
		rule.Delay = late
	}

	switch wc.flow {
	case "basic":
		target.Wire.Set(rule)
		p := e.run(mode, prod, cons)
		require.Positive(t, target.Wire.Applied(act), "the fault never applied")
		require.LessOrEqual(t, p.took, loadBound, "load reported too late")
		switch wc.want(act) {
		case "ok":
			require.True(t, p.loaded && p.ok, "want the load to succeed: %+v", p)
		case "fail":
			require.False(t, p.ok, "want the request to fall back to recompute: %+v", p)
		}
	case "abort":
		target.Wire.Set(rule)
		e.abort(mode, prod, cons)
		require.Positive(t, target.Wire.Applied(act), "the fault never applied")
	case "restart":
		require.True(t, e.run(mode, prod, cons).ok)
		if act == Delay {
			rule.Delay = 300 * time.Millisecond // a frame cannot outlive its connection by much
		}
		target.Wire.Set(rule)
		e.shutdown(prod)
		e.eventually(func() bool { return target.Wire.Applied(act) > 0 }, time.Second, says("the fault never applied"))
		e.drain(cons)
		prod = e.open(prodPort)
		p := e.run(mode, prod, cons)
		require.True(t, p.ok, "the restarted producer must serve: %+v", p)
	}

	// Faults off: the same pair still works.
	prod.Wire.Clear()
	cons.Wire.Clear()
	e.drain(prod, cons)
	if failedConnects(cons) > 0 {
		// A dial whose connect was lost backs its peer off for a moment, so
		// that requests meanwhile are served locally at once: let it pass.
		e.idle(tier.FirstConnectBackoff + 200*time.Millisecond)
	}
	p := e.run(mode, prod, cons)
	require.True(t, p.ok, "a request after the fault must succeed: %+v", p)
	e.finish()
}

// drain waits until no frame of nodes is delayed, held or swapped, and
// what the last of them set off has settled. A frame of a session that
// ended can still end a later one: the wire names no session.
func (e *env) drain(nodes ...*Node) {
	e.t.Helper()
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
	e.idle(100 * time.Millisecond)
}

// abort has the host finish a request while its load is in flight: PD
// before the prefill started, P2P while the rows are being written.
func (e *env) abort(mode string, prod, cons *Node) {
	t := e.t
	kv := uniq("abort")
	keys := keysFor(kv, 4)
	req := "d-" + kv
	var p pull
	if mode == "pd" {
		_, err := cons.StartRequest(req, prefillerParams(kv, prod))
		require.NoError(t, err)
		p = e.submitLoad(cons, req, keys)
		e.eventually(func() bool { return prod.Stats().ServeKeysWanted == len(keys) }, loadBound,
			says("the fetch never reached the prefiller"))
	} else {
		rows := e.rows(prod, len(keys))
		for i, k := range keys {
			prod.Hold(k, rows[i])
		}
		_, err := cons.StartRequest(req, sourceParams(kv, prod))
		require.NoError(t, err)
		require.NotContains(t, e.probe(cons, req, keys), tier.Miss, "the producer holds every key")
		e.c.Data.SetDelay(400 * time.Millisecond)
		defer e.c.Data.SetDelay(0)
		p = e.submitLoad(cons, req, keys)
		e.eventually(func() bool { return prod.Wire.Seen(In, protocol.TypeFetch) > 0 }, loadBound,
			says("the fetch never reached the producer"))
		e.idle(50 * time.Millisecond) // the write is in flight now
	}
	aborted := time.Now()
	require.NoError(t, cons.FinishRequest(req))
	p = e.settle(cons, p, e.wait(p.job, time.Second+slack))
	require.LessOrEqual(t, time.Since(aborted), time.Second+slack, "an aborted load ends within the abort-ack timeout")
	if mode == "p2p" {
		return // the rows were being written while still expected: success and failure are both right
	}
	require.False(t, p.ok, "nothing was stored: the load cannot have succeeded")
	// The prefill comes only now: none of its rows may reach the consumer.
	store, _ := e.prefill(prod, kv, keys)
	e.wait(store, jobsBound)
	e.idle(50 * time.Millisecond)
	e.checkUntouched(cons, p.slots)
}

// failedConnects counts p's dials that never came up.
func failedConnects(p *Node) int64 {
	n := int64(0)
	for _, c := range p.Stats().PeerConnectFailures {
		n += c
	}
	return n
}

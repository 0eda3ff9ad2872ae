package hostile

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/peerkv/peerkv/core/protocol"
)

// Case 12. One session's lookups under 10 000 fresh kv ids are capped by
// max_requests_per_peer: beyond it they are answered at once, all-miss (or
// refused), never queued for the host; 10 000 abort_fetch for unknown
// rounds leave no lasting state.
func TestPerPeerRequestGrowthIsCapped(t *testing.T) {
	t.Parallel()
	const capReq, n = 100, 10000
	T := OpenNode(t, map[string]any{"max_requests_per_peer": capReq, "inbound_lookup_timeout_s": 20.0,
		"reaped_id_retention_s": 1.0})
	D := OpenNode(t, nil)
	a := NewAttacker(t, "127.0.0.1")
	c := a.Dial(T.ID(), a.ID, "")
	c.Handshake(3 * time.Second)

	resps, hits, refused := 0, 0, false
	count := func() {
		for _, f := range a.Take(Is(T.ID(), c.Identity, "")) {
			switch f.Type {
			case "lookup_resp":
				resps++
				hs, _ := f.Map["hits"].([]any)
				for _, h := range hs {
					if h == true {
						hits++
					}
				}
			case "disconnect":
				refused = true
			}
		}
	}
	for i := range n {
		c.Send(&protocol.Lookup{KVRequestID: fmt.Sprintf("g-%d", i), Keys: [][]byte{Key("g", i)}})
		if i%50 == 49 {
			a.Pump(0)
			count()
		}
	}
	// Answered at once means within the node's own pace, well before the
	// 20 s inbound timeout: the wait ends as soon as they are in, and its
	// bound only keeps a loaded machine (the node took 8 s for 1 800 of
	// them beside a full CI run) from failing it.
	sent := time.Now()
	for time.Since(sent) < 15*time.Second && resps < n-capReq && !refused {
		a.Pump(20 * time.Millisecond)
		count()
	}
	st := T.Stats()
	if st.Sessions == 0 {
		refused = true // the node dropped the flooding session
	}
	t.Logf("after 10000 lookups: %d answered, %d hits, refused %v; queued for the host %d, active %d",
		resps, hits, refused, st.InboundQueued, st.InboundActive)
	if t.Failed() || resps < n-capReq {
		t.Logf("target: %+v\n%s", st, tail(T.Logs()))
	}
	assert.LessOrEqual(t, st.InboundActive, capReq, "inbound lookups held for the host beyond max_requests_per_peer")
	assert.LessOrEqual(t, st.InboundQueued, capReq, "inbound lookups queued for the host beyond max_requests_per_peer")
	if !refused {
		assert.GreaterOrEqual(t, resps, n-capReq, "lookups beyond max_requests_per_peer must be answered at once (inbound_lookup_timeout is 20 s)")
	}
	assert.Zero(t, hits, "a lookup for keys nobody holds was answered hit")
	ids := map[string]bool{}
	for _, in := range drainInbound(t, T) {
		ids[in.ReqID] = true
	}
	assert.LessOrEqual(t, len(ids), capReq, "lookups handed to the host")

	if refused {
		c = a.Dial(T.ID(), a.Listen("127.0.0.1"), "")
		c.Handshake(3 * time.Second)
	}
	for i := range n {
		c.Send(&protocol.AbortFetch{KVRequestID: fmt.Sprintf("ab-%d", i)})
		if i%50 == 49 {
			a.Pump(0)
			a.Take(Is(T.ID(), "", ""))
		}
	}
	T.RequireGauge("serve_kv_ids", 5*time.Second, func(v int64) bool { a.Pump(0); a.Take(Is(T.ID(), "", "")); return v <= capReq },
		"abort_fetch for 10000 unknown rounds leaves at most max_requests_per_peer kv ids behind")
	Pull(t, T, D)
}

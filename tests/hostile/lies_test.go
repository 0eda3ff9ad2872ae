package hostile

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/protocol"
)

// lieEnv is a target T that prefills a "victim" request (4 stored rows,
// one host job), a real decoder D for the health pull, and the attacker
// after a correct handshake with T.
type lieEnv struct {
	T, D  *Node
	a     *Attacker
	c     *Conn
	kv    string
	keys  [][]byte
	store int64
}

// Lies after a correct handshake: each must leave the node healthy (a real
// node still pulls correctly) and every host job reported exactly once.
func TestLiesAfterACorrectHandshake(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts map[string]any
		lie  func(t *testing.T, e *lieEnv)
	}{
		{"fetch rows outside the consumer's region", nil, func(t *testing.T, e *lieEnv) {
			e.c.Send(&protocol.Fetch{KVRequestID: e.kv, Keys: e.keys, BlockIndexes: []uint64{0, 1, 2, 1000}})
			f, ok := e.c.Await("transfer_done", 2*time.Second)
			if ok {
				assert.False(t, f.Bool("success"), "a fetch into row 1000 of a 64-row consumer succeeded")
			} else {
				_, ok = e.c.Await("disconnect", 0)
				assert.True(t, ok, "a fetch into rows outside the consumer's region got neither transfer_done false nor a disconnect")
			}
			assert.Zero(t, e.a.Sink.Rows(), "rows were written for a fetch outside the consumer's region")
		}},
		{"fetch with more keys than block_indexes", nil, func(t *testing.T, e *lieEnv) {
			bad := e.T.Stats().BadFrames
			e.c.SendMap(map[string]any{"type": "fetch", "kv_request_id": e.kv, "keys": []any{e.keys[0], e.keys[1], e.keys[2]},
				"block_indexes": []any{uint64(0), uint64(1)}, "round_seq": uint64(0)})
			within(t, 2*time.Second, func() bool { return e.T.Stats().BadFrames > bad }, "the mismatched fetch was not rejected")
		}},
		{"duplicate fetch for a round", nil, func(t *testing.T, e *lieEnv) {
			f := &protocol.Fetch{KVRequestID: e.kv, Keys: e.keys, BlockIndexes: rows64(0, 4)}
			e.c.Send(f)
			e.c.Send(f)
			time.Sleep(300 * time.Millisecond)
		}},
		{"transfer_done and abort_ack for unknown rounds", nil, func(t *testing.T, e *lieEnv) {
			e.c.Send(&protocol.TransferDone{KVRequestID: "nope", Success: true, RoundSeq: 7})
			e.c.Send(&protocol.TransferDone{KVRequestID: e.kv, Success: true, RoundSeq: 0})
			e.c.Send(&protocol.AbortAck{KVRequestID: "nope", RoundSeq: 3})
			e.c.Send(&protocol.AbortAck{KVRequestID: e.kv, RoundSeq: 0})
			e.c.Send(&protocol.LookupResp{KVRequestID: e.kv, Keys: e.keys, Hits: []bool{true, true, true, true}})
			time.Sleep(300 * time.Millisecond)
		}},
		{"lookup with max_list_items+1 keys", map[string]any{"max_list_items": 100}, func(t *testing.T, e *lieEnv) {
			bad := e.T.Stats().BadFrames
			e.c.Send(&protocol.Lookup{KVRequestID: e.kv, Keys: Keys("many", 101)})
			within(t, 2*time.Second, func() bool { return e.T.Stats().BadFrames > bad }, "the oversized lookup was not rejected")
		}},
		{"truncated frames", nil, func(t *testing.T, e *lieEnv) {
			bad := e.T.Stats().BadFrames
			b, err := protocol.Encode(&protocol.Fetch{KVRequestID: e.kv, Keys: e.keys, BlockIndexes: rows64(0, 4)})
			require.NoError(t, err)
			e.c.SendRaw(b[:len(b)/2])
			within(t, 2*time.Second, func() bool { return e.T.Stats().BadFrames > bad }, "the truncated frame was not rejected")
			// and on a second session, a frame cut inside a str header
			c2 := e.a.Dial(e.T.ID(), e.a.Listen("127.0.0.1"), "")
			c2.Handshake(3 * time.Second)
			bad = e.T.Stats().BadFrames
			c2.SendRaw([]byte{0x85, 0xa4, 't', 'y'})
			within(t, 2*time.Second, func() bool { return e.T.Stats().BadFrames > bad }, "the truncated frame was not rejected")
		}},
		{"unknown message types", nil, func(t *testing.T, e *lieEnv) {
			e.c.SendMap(map[string]any{"type": "peerkv_bogus", "kv_request_id": e.kv})
			e.c.SendMap(map[string]any{"type": strings.Repeat("x", 300)})
			time.Sleep(300 * time.Millisecond)
		}},
		{"messages before connect", nil, func(t *testing.T, e *lieEnv) {
			id := e.a.Listen("127.0.0.1")
			c2 := e.a.Dial(e.T.ID(), id, "")
			dropped := e.T.Stats().DroppedFrames
			sessions := e.T.Stats().Sessions
			c2.Send(&protocol.Fetch{KVRequestID: e.kv, Keys: e.keys, BlockIndexes: rows64(0, 4)})
			c2.Send(&protocol.Lookup{KVRequestID: e.kv, Keys: e.keys})
			c2.Send(&protocol.ConnectAck{PeerID: id})
			c2.Send(&protocol.AbortFetch{KVRequestID: e.kv})
			within(t, 2*time.Second, func() bool { return e.T.Stats().DroppedFrames >= dropped+4 }, "frames before connect were not dropped")
			assert.Equal(t, sessions, e.T.Stats().Sessions, "a frame before connect opened a session")
			_, got := c2.Await("", 300*time.Millisecond)
			assert.False(t, got, "the node answered frames sent before connect")
		}},
		{"a second connect", nil, func(t *testing.T, e *lieEnv) {
			e.c.Send(e.a.ConnectMsg(e.c.Identity))
			_, ok := e.T.LogMatch(`(?i)duplicate connect|second connect`, 2*time.Second)
			assert.True(t, ok, "a second connect was not treated as a protocol error: %s", tail(e.T.Logs()))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			opts := map[string]any{"unbound_store_timeout_s": 1.5, "store_timeout_s": 1.5}
			for k, v := range tc.opts {
				opts[k] = v
			}
			e := &lieEnv{T: OpenNode(t, opts), D: OpenNode(t, nil), a: NewAttacker(t, "127.0.0.1")}
			e.kv = uniq("victim")
			e.keys = Keys(e.kv, 4)
			e.T.Prefill("victim", e.kv)
			e.store = e.T.Store("victim", e.keys, Range(0, 4))
			e.c = e.a.Dial(e.T.ID(), e.a.ID, "")
			e.c.Handshake(3 * time.Second)

			tc.lie(t, e)

			for _, in := range drainInbound(t, e.T) {
				assert.Fail(t, "a lie reached the host", "inbound %q", in.ReqID)
			}
			require.NoError(t, e.T.FinishRequest("victim"))
			e.T.MustJob(e.store, 6*time.Second)
			Pull(t, e.T, e.D)
		})
	}
}

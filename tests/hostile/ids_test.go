package hostile

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/peerkv/peerkv/core/protocol"
	"github.com/peerkv/peerkv/core/tier"
)

// drainInbound runs the host's serve passes: every Evaluate item is
// answered all-miss; it returns the items it saw.
func drainInbound(t *testing.T, n *Node) []tier.Inbound {
	t.Helper()
	var seen []tier.Inbound
	for pass := 0; pass < 3; pass++ {
		for {
			in, ok, taken := n.NextInbound(nil)
			if !ok || !taken {
				break
			}
			seen = append(seen, in)
			if in.Kind == tier.InboundEvaluate {
				miss := make([]tier.LookupResult, len(in.Keys))
				for i := range miss {
					miss[i] = tier.Miss
				}
				_, err := n.AnswerInbound(in.LookupID, miss, -1, nil)
				assert.NoError(t, err)
			}
		}
	}
	return seen
}

// Case 8. A kv_request_id with a NUL or another control character is a
// protocol error, never handed to the host.
func TestControlCharactersInKVRequestIDAreRejected(t *testing.T) {
	t.Parallel()
	T := OpenNode(t, nil)
	D := OpenNode(t, nil)
	a := NewAttacker(t, "127.0.0.1")
	for _, m := range []protocol.Message{
		&protocol.Lookup{KVRequestID: "victim\x00A", Keys: Keys("v", 2)},
		&protocol.Lookup{KVRequestID: "victim\x1b[2J", Keys: Keys("v", 2)},
		&protocol.Lookup{KVRequestID: "victim\nERROR forged log line", Keys: Keys("v", 2)},
		&protocol.Fetch{KVRequestID: "victim\x01B", Keys: Keys("v", 2), BlockIndexes: []uint64{0, 1}},
		&protocol.Fetch{KVRequestID: "victim\x7f", Keys: Keys("v", 2), BlockIndexes: []uint64{0, 1}},
	} {
		id := a.Listen("127.0.0.1")
		c := a.Dial(T.ID(), id, "")
		c.Handshake(3 * time.Second)
		bad := T.Stats().BadFrames
		c.Send(m)
		var kv string
		switch v := m.(type) {
		case *protocol.Lookup:
			kv = v.KVRequestID
		case *protocol.Fetch:
			kv = v.KVRequestID
		}
		assert.Eventually(t, func() bool { return T.Stats().BadFrames > bad }, 2*time.Second, 10*time.Millisecond,
			"%s with kv_request_id %q was not rejected as a bad frame", m.MsgType(), kv)
	}
	for _, in := range drainInbound(t, T) {
		assert.False(t, strings.Contains(in.ReqID, "victim"), "handed to the host: %q", in.ReqID)
	}
	Pull(t, T, D)
}

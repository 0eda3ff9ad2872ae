package hostile

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/peerkv/peerkv/core/protocol"
)

// Case 10. One source address (127.0.0.2) claiming 40 identities cannot
// fill max_peers: it gets at most max_peers_per_host sessions, and a real
// node on 127.0.0.1 still opens a session and pulls.
func TestPerHostCapKeepsRoomForOthers(t *testing.T) {
	t.Parallel()
	const perHost = 4
	T := OpenNode(t, map[string]any{"max_peers": 16, "max_peers_per_host": perHost})
	D := OpenNode(t, nil)
	a := NewAttacker(t, "127.0.0.2")
	for range 40 {
		id := a.Listen("127.0.0.2")
		c := a.Dial(T.ID(), id, "127.0.0.2")
		c.Send(a.ConnectMsg(id))
		c.Send(&protocol.ConnectAck{PeerID: id})
	}
	acked := map[string]bool{}
	deadline := time.Now().Add(1500 * time.Millisecond)
	for time.Now().Before(deadline) {
		a.Pump(20 * time.Millisecond)
		for _, f := range a.Take(Is(T.ID(), "", "connect_ack")) {
			acked[f.To] = true
		}
	}
	t.Logf("%d of 40 identities from 127.0.0.2 were acked; node sessions %d", len(acked), T.Stats().Sessions)
	assert.LessOrEqual(t, len(acked), perHost, "sessions completed from one source address")
	Pull(t, T, D)
	st := T.Stats()
	assert.LessOrEqual(t, st.Sessions-1, perHost, "sessions from 127.0.0.2 (all sessions but the real node's)")
}

package hostile

import (
	"testing"
	"time"

	"github.com/peerkv/peerkv/core/protocol"
)

// Case 9. Fifty correct connects, each dropped at once (a disconnect, or the
// attacker vanishing): the node keeps no session and no data-path
// registration.
func TestConnectChurnLeavesNothingBehind(t *testing.T) {
	t.Parallel()
	T := OpenNode(t, nil)
	D := OpenNode(t, nil)
	a := NewAttacker(t, "127.0.0.1")
	for i := range 50 {
		id := a.Listen("127.0.0.1")
		c := a.Dial(T.ID(), id, "")
		c.Send(a.ConnectMsg(id))
		if i%2 == 0 {
			c.Send(&protocol.Disconnect{})
			c.CloseAfterFlush()
		} else {
			c.CloseAfterFlush()
			a.Unlisten(id) // gone entirely: the node's answers find nobody
		}
		a.Pump(0)
	}
	// Half-open sessions end at the 2 s handshake deadline; the slack is for
	// a loaded machine, not for the node.
	within(t, 12*time.Second, func() bool { a.Pump(0); return T.Stats().Sessions == 0 },
		"the node still holds %d sessions after the churn", T.Stats().Sessions)
	T.RequireGauge("data_peers", 3*time.Second, func(v int64) bool { return v == 0 }, "no data-path registration outlives its session")
	within(t, 3*time.Second, func() bool { return !T.HasPendingWork() }, "the node has pending work after the churn")
	Pull(t, T, D)
}

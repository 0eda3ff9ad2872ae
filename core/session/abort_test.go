package session

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/protocol"
)

// heldWrites is a data path whose writes stay in flight (a slow link) until
// the test completes them, and that records what it is asked to cancel.
type heldWrites struct {
	data.Transport
	next     uint64
	writes   []uint64
	canceled []uint64
}

func (h *heldWrites) Write(string, []uint64, []uint64) (uint64, error) {
	h.next++
	h.writes = append(h.writes, h.next)
	return h.next, nil
}

func (h *heldWrites) Cancel(_ string, id uint64) { h.canceled = append(h.canceled, id) }

func sentOf[M protocol.Message](ms []protocol.Message) []M {
	var out []M
	for _, m := range ms {
		if x, ok := m.(M); ok {
			out = append(out, x)
		}
	}
	return out
}

// An abort cancels the aborted round's writes still in flight, and only
// them, and is acknowledged as soon as they report, not after their bytes
// crossed a slow link; the load beside it goes on.
func TestAnAbortCancelsItsWritesInFlightAndIsAckedWhenTheyStop(t *testing.T) {
	p := handshaked(t)
	held := &heldWrites{Transport: p.b.env.Data}
	p.b.env.Data = held
	for i, kv := range []string{"slow", "beside"} {
		p.sa.RequestBlocks(int64(10+i), kv, [][]byte{key(2 * i), key(2*i + 1)}, []uint64{uint64(2 * i), uint64(2*i + 1)})
	}
	p.pump()
	p.sb.AddStoredBlocks("slow", [][]byte{key(0), key(1)}, []uint64{0, 1}, 20, 0, false)
	p.sb.AddStoredBlocks("beside", [][]byte{key(2), key(3)}, []uint64{2, 3}, 21, 0, false)
	require.Len(t, held.writes, 2, "both loads' rows are on their way")
	slow, beside := held.writes[0], held.writes[1]

	p.sa.AbortLoad("slow", 0)
	p.pump()
	assert.Equal(t, []uint64{slow}, held.canceled, "the abort cancels its own write, not the one beside it")

	p.sb.Complete(data.Completion{ID: slow, Err: data.ErrCanceled}) // the path: nothing more of it will be written
	acks := sentOf[*protocol.AbortAck](p.b.take())
	require.Len(t, acks, 1, "acknowledged once its write stopped")
	p.sa.Handle(acks[0])
	assert.Equal(t, map[int64]bool{10: false}, p.a.loads, "the aborted load is reported")
	assert.Equal(t, map[int64]bool{20: false}, p.b.stores)
	for _, line := range p.b.logs {
		assert.False(t, strings.HasPrefix(line, "WARNING") && strings.Contains(line, "failed"),
			"a canceled write is no failure to warn about: %s", line)
	}

	p.sb.Complete(data.Completion{ID: beside, Err: nil})
	p.pump()
	assert.Equal(t, map[int64]bool{10: false, 11: true}, p.a.loads, "the load beside it succeeds")
	assert.False(t, p.sa.Dead() || p.sb.Dead(), "the session lives on")
}

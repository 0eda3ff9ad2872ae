package faults

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/protocol"
	"github.com/peerkv/peerkv/core/tier"
)

// failsFast is how soon a producer that cannot supply must say so (with
// transfer_done success=false), well inside the 2 s load timeout.
const failsFast = time.Second

// TestEvictionBetweenLookupAndFetch (P2P): the host answered HIT and
// pinned, the consumer fetches only after store_timeout. The pin is
// released at store_timeout, the host evicts and reuses the rows, and the
// late fetch is answered transfer_done success=false, never with the
// reused rows.
func TestEvictionBetweenLookupAndFetch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	prod, cons := e.open(prodPort), e.open(consPort)
	kv := uniq("evict")
	keys := keysFor(kv, 3)
	rows := e.rows(prod, len(keys))
	for i, k := range keys {
		prod.Hold(k, rows[i])
	}
	req := "c-" + kv
	_, err := cons.StartRequest(req, sourceParams(kv, prod))
	require.NoError(t, err)
	require.NotContains(t, e.probe(cons, req, keys), tier.Miss)
	pinned := time.Now()
	pins := prod.Pins()
	require.NotEmpty(t, pins)
	for _, pin := range pins {
		r := e.wait(pin, 3*time.Second+slack)
		require.False(t, r.Success, "an unfetched pin is released, failed")
	}
	require.GreaterOrEqual(t, time.Since(pinned), 3*time.Second-100*time.Millisecond, "not before store_timeout")
	for i, k := range keys { // eviction: the rows now hold other blocks
		prod.Evict(k)
		Fill(prod.Row(rows[i]), Key(fmt.Sprintf("reused/%d", i)))
	}

	doneBefore := cons.Wire.Seen(In, protocol.TypeTransferDone)
	p := e.submitLoad(cons, req, keys)
	p = e.settle(cons, p, e.wait(p.job, loadBound))
	require.False(t, p.ok, "the pinned rows are gone")
	require.Less(t, p.took, failsFast, "answered at once, not at the load timeout")
	require.Greater(t, cons.Wire.Seen(In, protocol.TypeTransferDone), doneBefore, "answered by transfer_done")
	e.idle(50 * time.Millisecond)
	e.checkUntouched(cons, p.slots)
	require.NoError(t, cons.FinishRequest(req))
	require.True(t, e.run("p2p", prod, cons).ok)
	e.finish()
}

// TestLateFetchAfterUnboundExpiry (PD): the prefill's stores expire
// unfetched at unbound_store_timeout, the host reuses the rows, and the
// decoder's fetch that comes later is answered transfer_done
// success=false at once, never with the reused rows.
func TestLateFetchAfterUnboundExpiry(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	prod, cons := e.open(prodPort), e.open(consPort)
	kv := uniq("unbound")
	keys := keysFor(kv, 4)
	stored := time.Now()
	store, rows := e.prefill(prod, kv, keys)
	r := e.wait(store, 3*time.Second+slack)
	require.False(t, r.Success, "unfetched stores expire, failed")
	require.GreaterOrEqual(t, time.Since(stored), 3*time.Second-100*time.Millisecond, "not before unbound_store_timeout")
	for i, row := range rows {
		Fill(prod.Row(row), Key(fmt.Sprintf("reused/%d", i)))
	}

	doneBefore := cons.Wire.Seen(In, protocol.TypeTransferDone)
	p := e.decode(prod, cons, kv, keys)
	require.True(t, p.loaded)
	require.False(t, p.ok, "its stores expired")
	require.Less(t, p.took, failsFast, "answered at once, not at the load timeout")
	require.Greater(t, cons.Wire.Seen(In, protocol.TypeTransferDone), doneBefore, "answered by transfer_done")
	e.idle(50 * time.Millisecond)
	e.checkUntouched(cons, p.slots)
	require.True(t, e.run("pd", prod, cons).ok)
	e.finish()
}

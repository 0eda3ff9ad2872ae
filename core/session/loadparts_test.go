package session

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/protocol"
)

// What the tier needs to spread one load over several sources: a round per
// fetch, a per-round abort, a lookup sent now for one request, and the
// answers read without registering anything.

func lookups(ms []protocol.Message) []*protocol.Lookup {
	var out []*protocol.Lookup
	for _, m := range ms {
		if l, ok := m.(*protocol.Lookup); ok {
			out = append(out, l)
		}
	}
	return out
}

func TestFlushLookupSendsOnlyThatRequestNow(t *testing.T) {
	p := handshaked(t)
	p.sa.RegisterLookup("kv1", key(1))
	p.sa.RegisterLookup("kv2", key(2))
	p.sa.FlushLookup("kv1")
	sent := lookups(p.a.take())
	require.Len(t, sent, 1)
	assert.Equal(t, "kv1", sent[0].KVRequestID)
	p.sa.FlushLookup("kv1") // nothing new registered
	assert.Empty(t, p.a.take())
	p.sa.FlushLookups()
	sent = lookups(p.a.take())
	require.Len(t, sent, 1, "the step end still sends the other request's lookup")
	assert.Equal(t, "kv2", sent[0].KVRequestID)
}

func TestProbedReadsAnswersWithoutRegistering(t *testing.T) {
	p := handshaked(t)
	_, known := p.sa.Probed("kv", key(1))
	assert.False(t, known)
	p.sa.FlushLookups()
	assert.Empty(t, p.a.take(), "Probed asks nobody")
	p.sa.RegisterLookup("kv", key(1))
	p.sa.RegisterLookup("kv", key(2))
	p.sa.FlushLookups()
	p.a.take()
	p.sa.Handle(&protocol.LookupResp{KVRequestID: "kv", Keys: [][]byte{key(1), key(2)}, Hits: []bool{true, false}})
	hit, known := p.sa.Probed("kv", key(1))
	assert.True(t, hit && known)
	hit, known = p.sa.Probed("kv", key(2))
	assert.True(t, known && !hit)
}

func TestRoundsAreReportedAndAbortedOneByOne(t *testing.T) {
	p := handshaked(t)
	r0 := p.sa.RequestBlocks(7, "kv", [][]byte{key(1)}, []uint64{1})
	r1 := p.sa.RequestBlocks(7, "kv", [][]byte{key(2)}, []uint64{2})
	require.Equal(t, []uint64{0, 1}, []uint64{r0, r1}, "each fetch closes its own round")
	p.a.take()
	var rounds []uint64
	p.a.env.Report = func(r Report) {
		if r.Kind == LoadDone {
			rounds = append(rounds, r.Round)
		}
	}
	p.sa.AbortLoad("kv", r1)
	p.sa.AbortLoad("kv", r1) // once
	p.sa.AbortLoad("kv", 9)  // no such round
	var aborts []uint64
	for _, m := range p.a.take() {
		if a, ok := m.(*protocol.AbortFetch); ok {
			aborts = append(aborts, a.RoundSeq)
		}
	}
	assert.Equal(t, []uint64{r1}, aborts)
	p.sa.Handle(&protocol.AbortAck{KVRequestID: "kv", RoundSeq: r1})
	p.sa.Handle(&protocol.TransferDone{KVRequestID: "kv", RoundSeq: r0, Success: true})
	assert.Equal(t, []uint64{r1, r0}, rounds, "every LoadDone names its round")
}

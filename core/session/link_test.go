package session

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/protocol"
)

// fakeLink is a role's whole world: what it sends, reports, takes back and
// fails with, with no Session behind it.
type fakeLink struct {
	o        *fakeOwner
	sent     []protocol.Message
	reports  []Report
	queued   map[protocol.Message]bool // messages unsend finds still queued
	failed   []string
	engaged  int
	ended    bool
	peerRows uint64
}

func newFakeLink(t *testing.T) *fakeLink {
	return &fakeLink{o: newOwner(t, "127.0.0.1:1001"), queued: map[protocol.Message]bool{}, peerRows: testRows}
}

func (f *fakeLink) link() link {
	return link{
		peerID: "127.0.0.1:1002",
		env:    f.o.env,
		send:   func(m protocol.Message) { f.sent = append(f.sent, m) },
		unsend: func(m protocol.Message) bool {
			was := f.queued[m]
			delete(f.queued, m)
			return was
		},
		report:   func(r Report) { f.reports = append(f.reports, r) },
		engaged:  func() { f.engaged++ },
		fail:     func(reason string) { f.failed = append(f.failed, reason) },
		ended:    func() bool { return f.ended },
		verifies: func() bool { return false },
		peerRows: func() uint64 { return f.peerRows },
	}
}

func (f *fakeLink) kinds() []ReportKind {
	out := make([]ReportKind, len(f.reports))
	for i, r := range f.reports {
		out[i] = r.Kind
	}
	return out
}

func TestTheConsumerWorksThroughItsLinkAlone(t *testing.T) {
	f := newFakeLink(t)
	c := newConsumer(f.link())

	_, known := c.registerLookup("kv", key(1))
	require.False(t, known)
	assert.Equal(t, 1, f.engaged, "a new request makes the role busy")
	c.flushAll()
	require.Len(t, f.sent, 1)
	assert.Equal(t, protocol.TypeLookup, f.sent[0].MsgType())
	c.onLookupResp(&protocol.LookupResp{KVRequestID: "kv", Keys: [][]byte{key(1)}, Hits: []bool{true}})
	assert.Equal(t, []ReportKind{ProbesAnswered}, f.kinds())
	hit, known := c.probed("kv", key(1))
	assert.True(t, hit && known)

	// A load whose fetch is still queued is taken back and reported at once.
	round := c.requestBlocks(1, "kv", [][]byte{key(1)}, []uint64{0})
	fetch := f.sent[len(f.sent)-1]
	f.queued[fetch] = true
	c.abortLoad("kv", round)
	require.Equal(t, LoadDone, f.reports[len(f.reports)-1].Kind)
	assert.Equal(t, protocol.TypeFetch, f.sent[len(f.sent)-1].MsgType(), "no abort_fetch for a fetch never sent")

	// A load whose abort is never acked fails the session through fail.
	round = c.requestBlocks(2, "kv", [][]byte{key(2)}, []uint64{1})
	c.abortLoad("kv", round)
	assert.Equal(t, protocol.TypeAbortFetch, f.sent[len(f.sent)-1].MsgType())
	f.o.now = f.o.now.Add(f.o.env.Cfg.AbortAckTimeout + time.Second)
	c.tick(f.o.now)
	last := f.reports[len(f.reports)-1]
	assert.Equal(t, LoadDone, last.Kind)
	assert.Equal(t, int64(2), last.JobID)
	assert.True(t, last.Fence)
	require.Len(t, f.failed, 1)
	assert.Contains(t, f.failed[0], "no abort_ack")
	for _, r := range f.reports {
		assert.Nil(t, r.Session, "a role's reports name no session: the session stamps them")
	}
}

func TestTheProducerWorksThroughItsLinkAlone(t *testing.T) {
	f := newFakeLink(t)
	p := newProducer(f.link())

	// A fetch for rows outside the consumer's region fails at once.
	require.NoError(t, p.onFetch(&protocol.Fetch{KVRequestID: "bad", Keys: [][]byte{key(1)}, BlockIndexes: []uint64{f.peerRows}}))
	require.Len(t, f.sent, 1)
	done := f.sent[0].(*protocol.TransferDone)
	assert.False(t, done.Success)

	// A lookup goes to the owner; the host's answer goes to the peer.
	require.NoError(t, p.onLookup(&PreparedLookup{Lookup: &protocol.Lookup{KVRequestID: "kv", Keys: [][]byte{key(1), key(2)}}}))
	require.Equal(t, InboundReady, f.reports[len(f.reports)-1].Kind)
	l := f.reports[len(f.reports)-1].Lookup
	l.CheckOut()
	finished, err := p.answer(l, []Answer{AnswerMiss, AnswerMiss}, -1, nil)
	require.NoError(t, err)
	assert.True(t, finished)
	resp := f.sent[len(f.sent)-1].(*protocol.LookupResp)
	assert.Equal(t, []bool{false, false}, resp.Hits)

	// Once the session ended, supply and late answers release their pins.
	f.ended = true
	p.addStored("pd", [][]byte{key(3)}, []uint64{3}, 9, 0, false)
	last := f.reports[len(f.reports)-1]
	assert.Equal(t, StoreDone, last.Kind)
	assert.Equal(t, int64(9), last.JobID)
	assert.False(t, last.OK)
	p.close()
}

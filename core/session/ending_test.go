package session

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/protocol"
)

// A session ends once: whatever ends it later (a protocol error, a close,
// the peer's goodbye) changes nothing of how the first end was recorded,
// sends nothing and reports nothing (the fake owner fails on a second
// Ended). Here the first end is a rejection that logged its own line: a
// later end must not make the owner log it again.
func TestOnlyTheFirstEndCounts(t *testing.T) {
	b := newOwner(t, "127.0.0.1:1002")
	s := b.open("127.0.0.1:1001", false)
	s.Handle(&protocol.Connect{PeerID: "127.0.0.1:9999", AgentMetadata: []byte{}, NumBlocks: 8, BlockLen: testRowLen, HashSeed: "42"})
	require.True(t, s.Dead())
	require.True(t, b.ended)
	require.Equal(t, []protocol.Type{protocol.TypeDisconnect}, types(b.take()), "the rejection's goodbye")
	reason := s.DeathReason()
	require.Contains(t, reason, "rejected its connect")

	s.HandleDecodeError(errors.New("garbage after the end"))
	s.Handle(&protocol.Disconnect{})
	s.Tick(b.now.Add(s.env.Cfg.HandshakeTimeout * 10))

	assert.Empty(t, b.take(), "no second goodbye")
	assert.Equal(t, reason, s.DeathReason())
	assert.True(t, s.DeathLogged(), "the rejection's line was logged; the owner must not log the end again")
	assert.Equal(t, CauseIdentity, s.RejectCause())
	assert.False(t, s.Orderly())
	_, _, unreached := s.ConnectFailed()
	assert.False(t, unreached)
}

// Close's How decides whether the peer gets a goodbye and how the owner
// logs the end; a second Close changes nothing.
func TestEachHowOfCloseSaysGoodbyeOrNot(t *testing.T) {
	for name, c := range map[string]struct {
		how            How
		goodbye        bool
		orderly        bool
		cause          string
		unsure, unreac bool
	}{
		"orderly":   {how: Orderly, goodbye: true, orderly: true},
		"failure":   {how: Failure, goodbye: true},
		"zero":      {how: How{}, goodbye: true},
		"dropped":   {how: Dropped},
		"unreached": {how: Unreached("refused", true), cause: "refused", unsure: true, unreac: true},
	} {
		t.Run(name, func(t *testing.T) {
			p := handshaked(t)
			p.sa.Close("the reason", c.how)
			require.True(t, p.sa.Dead())
			require.True(t, p.a.ended, "Ended reported")
			sent := types(p.a.take())
			if c.goodbye {
				assert.Equal(t, []protocol.Type{protocol.TypeDisconnect}, sent)
			} else {
				assert.Empty(t, sent)
			}
			assert.Equal(t, "the reason", p.sa.DeathReason())
			assert.Equal(t, c.orderly, p.sa.Orderly())
			assert.False(t, p.sa.DeathLogged(), "the owner logs an end from outside")
			cause, unsure, unreached := p.sa.ConnectFailed()
			assert.Equal(t, c.cause, cause)
			assert.Equal(t, c.unsure, unsure)
			assert.Equal(t, c.unreac, unreached)

			p.sa.Close("later", Orderly)
			assert.Empty(t, p.a.take(), "a second end sends nothing")
			assert.Equal(t, "the reason", p.sa.DeathReason())
			assert.Equal(t, c.orderly, p.sa.Orderly())
		})
	}
}

// The peer's goodbye after the handshake is an orderly end that sends
// nothing back; before it, a refusal of our connect.
func TestThePeersGoodbyeEndsTheSessionWithoutOneBack(t *testing.T) {
	p := handshaked(t)
	p.sa.Handle(&protocol.Disconnect{})
	assert.True(t, p.sa.Dead())
	assert.True(t, p.sa.Orderly())
	assert.Empty(t, p.sa.RejectCause())
	assert.Empty(t, p.a.take())

	a := newOwner(t, "127.0.0.1:1001")
	s := a.open("127.0.0.1:1002", true)
	a.take()
	s.Handle(&protocol.Disconnect{Refused: []string{"hash_seed"}})
	assert.True(t, s.Dead())
	assert.False(t, s.Orderly())
	assert.Equal(t, CauseRefusedByPeer, s.RejectCause())
	assert.Equal(t, []string{"hash_seed"}, s.Refused())
	assert.Empty(t, a.take())
}

// An end frees nothing by itself: what the session holds is reported once
// the owner releases it, and Release of a live session does nothing.
func TestReleaseFreesWhatAnEndedSessionHolds(t *testing.T) {
	p := handshaked(t)
	p.sa.Release()
	p.sa.RequestBlocks(7, "kv", [][]byte{key(1)}, []uint64{0})
	require.Len(t, p.a.take(), 1, "the fetch")
	p.sa.Release()
	assert.Empty(t, p.a.loads, "a live session is not released")
	assert.False(t, p.sa.Dead())

	p.sa.Close("connection lost", Dropped)
	assert.Empty(t, p.a.loads, "the end alone reports no load")
	p.sa.Release()
	assert.Equal(t, map[int64]bool{7: false}, p.a.loads, "released: the load fails, once")
	p.sa.Release()
	assert.Len(t, p.a.loads, 1)
}

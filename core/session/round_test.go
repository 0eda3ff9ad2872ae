package session

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/peerkv/peerkv/core/protocol"
)

// Each transition of a round is a method that refuses the moves its state
// does not allow.
func TestRoundTransitionsRefuseIllegalMoves(t *testing.T) {
	t0 := time.Unix(1_790_000_000, 0)
	later := t0.Add(time.Minute)

	t.Run("a tombstone is not revived by a fetch or killed again", func(t *testing.T) {
		r := newRound()
		r.kill(t0, false)
		r.fetch(later, 3)
		assert.Equal(t, roundDead, r.state)
		assert.True(t, r.fetchSeen, "a fetch was seen: a second is a protocol error")
		r.kill(later, true)
		assert.Equal(t, roundDead, r.state)
		assert.Equal(t, t0, r.since, "its deadline still runs from its death")
		assert.False(t, r.acked(), "no abort_ack is owed")
	})

	t.Run("an abort of a live round owes one ack", func(t *testing.T) {
		r := newRound()
		r.fetch(t0, 2)
		assert.True(t, r.abort(later), "its uncarried jobs go")
		assert.Equal(t, roundAborting, r.state)
		assert.True(t, r.supplyClosed)
		assert.False(t, r.abort(later), "a second abort changes nothing")
		assert.Equal(t, roundAborting, r.state)
		assert.True(t, r.acked())
		assert.Equal(t, roundDead, r.state)
		assert.False(t, r.acked(), "acked once")
	})

	t.Run("an abort of a failed round owes its ack too", func(t *testing.T) {
		r := newRound()
		r.kill(t0, false)
		assert.False(t, r.abort(later))
		assert.Equal(t, roundAborting, r.state)
		assert.Equal(t, t0, r.since)
	})

	t.Run("a live round is forgotten, a dead one kept", func(t *testing.T) {
		r := newRound()
		assert.False(t, r.entomb())
		assert.False(t, r.fetchSeen)
		r.kill(t0, false)
		assert.True(t, r.entomb())
		assert.True(t, r.fetchSeen)
	})

	t.Run("writes count only while the round lives", func(t *testing.T) {
		r := newRound()
		r.fetch(t0, 2)
		r.writeStarted()
		r.writeStarted()
		assert.False(t, r.ready(), "writes in flight")
		r.writeEnded(t0, true, 1, []uint64{0}, nil)
		assert.Equal(t, 1, r.remaining)
		r.writeEnded(later, false, 1, []uint64{1}, nil)
		assert.Equal(t, roundDead, r.state, "a failed write kills the round")
		assert.Equal(t, 1, r.remaining, "its rows are not counted")
		assert.True(t, r.ready())
		assert.False(t, r.succeeded())
	})

	t.Run("supply closes once and stays closed", func(t *testing.T) {
		r := newRound()
		r.fetch(t0, 1)
		assert.False(t, r.ready(), "demand unmet, supply may come")
		r.closeSupply()
		assert.True(t, r.ready(), "no supply can meet the demand")
		r.addJob(4, true)
		assert.True(t, r.fromLookup)
		r.addJob(5, false)
		assert.True(t, r.fromLookup, "a lookup's round stays one")
		r.dropJob(4)
		assert.Len(t, r.jobs, 1)
		r.dropJobs()
		assert.Empty(t, r.jobs)
	})
}

// The handshake's steps move only forward, each through its method.
func TestHandshakeStepsRefuseIllegalMoves(t *testing.T) {
	h := newHandshake(true, false)
	assert.Len(t, h.nonce, nonceLen, "a secret: our challenge is ready")
	assert.False(t, h.registered(), "no ack before the data path registers")
	assert.Error(t, h.expect(awaitingProof, "peerkv_proof"))
	assert.Error(t, h.refusesType(protocol.TypeLookup), "nothing but the handshake before a connect")

	c := &protocol.Connect{PeerID: "p", PeerKV: &protocol.Capabilities{Epoch: 7}}
	assert.NoError(t, h.sawConnect(c, time.Unix(0, 0)))
	assert.Equal(t, uint64(7), h.peerEpoch)
	h.accepted(c)
	h.challenged([]byte("0123456789abcdef"))
	assert.Error(t, h.sawConnect(c, time.Unix(0, 0)), "a second connect is a protocol error")
	assert.NoError(t, h.expect(awaitingProof, "peerkv_proof"))
	assert.Error(t, h.refusesType(protocol.TypeLookup), "no request before our ack")
	h.proved()
	h.proved()
	assert.Equal(t, awaitingPaths, h.step, "proved once")
	h.registering(16)
	assert.True(t, h.registered())
	assert.False(t, h.registered(), "acked once")
	assert.False(t, h.over(), "the peer has not acked ours")
	assert.True(t, h.peerAcked())
	assert.False(t, h.peerAcked(), "a repeated ack changes nothing")
	assert.True(t, h.over())
	assert.NoError(t, h.refusesType(protocol.TypeLookup))

	m := &protocol.Lookup{KVRequestID: "kv"}
	h.queue(m)
	assert.True(t, h.unqueue(m))
	assert.False(t, h.unqueue(m), "taken back once")
}

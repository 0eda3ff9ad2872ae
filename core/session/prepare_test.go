package session

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/protocol"
)

// A lookup prepared off the owner's lock (Prepare) is handled exactly as
// the same lookup unprepared: filed with its distinct keys, or, over
// max_keys_per_peer, answered all-miss with the same bytes and not filed.
func TestPreparedLookupsAreHandledAsUnprepared(t *testing.T) {
	const maxKeys = 6
	dup := &protocol.Lookup{KVRequestID: "dup", Keys: [][]byte{key(1), key(2), key(1), key(3)}}
	over := &protocol.Lookup{KVRequestID: "over", Keys: [][]byte{key(1), key(2), key(3), key(4), key(5), key(6), key(7)}}
	type outcome struct {
		pending [][]byte
		held    holdings
		sent    [][]byte
		logs    []string
	}
	run := func(prepare bool) outcome {
		p := handshaked(t, func(c *config.Config) { c.MaxKeysPerPeer = maxKeys })
		s, o := p.sb, p.b
		o.take()
		var out outcome
		for _, m := range []*protocol.Lookup{dup, over} {
			if prepare {
				s.Handle(Prepare(m, maxKeys))
			} else {
				s.Handle(m)
			}
		}
		require.Len(t, o.inbound, 1)
		out.pending, out.held, out.logs = o.inbound[0].Pending(), s.producer.held, o.logs
		for _, m := range o.take() {
			b, err := protocol.Encode(m)
			require.NoError(t, err)
			out.sent = append(out.sent, b)
		}
		return out
	}
	plain, prepared := run(false), run(true)
	assert.Equal(t, [][]byte{key(1), key(2), key(3)}, prepared.pending)
	assert.Equal(t, plain, prepared)
	require.Len(t, prepared.sent, 1, "the lookup over the cap is answered at once")
	_, isPrepared := Prepare(over, maxKeys).(*PreparedLookup)
	assert.True(t, isPrepared)
	_, isFetch := Prepare(&protocol.Fetch{}, maxKeys).(*protocol.Fetch)
	assert.True(t, isFetch, "messages with nothing to prepare are returned as they are")
}

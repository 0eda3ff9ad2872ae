package session

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/protocol"
)

// With both sides offering verified pulls, a successful transfer_done
// without a checksum for each row of the load fails it (cause "missing"),
// whatever the producer claims; with the sums, the load goes to the owner
// to check. Without the offer on both sides, no sums are expected.
func TestATransferDoneWithoutRowSumsFailsAVerifiedLoad(t *testing.T) {
	for name, c := range map[string]struct {
		mutate []func(*config.Config)
		sums   []uint64
		ok     bool
	}{
		"verified, no sums":        {nil, nil, false},
		"verified, too few sums":   {nil, []uint64{1}, false},
		"verified, a sum each row": {nil, []uint64{1, 2}, true},
		"not negotiated, no sums":  {[]func(*config.Config){func(c *config.Config) { c.NoVerifyPulls = true }}, nil, true},
	} {
		t.Run(name, func(t *testing.T) {
			p := handshaked(t, c.mutate...)
			require.Equal(t, c.mutate == nil, p.sa.Verifies())
			var got []Report
			p.a.env.Report = func(r Report) { got = append(got, r); p.a.apply(r) }
			round := p.sa.RequestBlocks(5, "kv", [][]byte{key(1), key(2)}, []uint64{3, 4})
			p.sa.Handle(&protocol.TransferDone{KVRequestID: "kv", Success: true, RoundSeq: round, RowSums: c.sums})
			require.Len(t, got, 1)
			assert.Equal(t, c.ok, got[0].OK)
			if c.ok && c.mutate == nil {
				assert.Equal(t, c.sums, got[0].Sums, "the owner checks the rows against these")
			} else {
				assert.Nil(t, got[0].Sums)
			}
			if !c.ok {
				assert.Equal(t, IntegrityMissing, got[0].Integrity)
				assert.True(t, got[0].Fence)
			}
		})
	}
}

// A peer that offers another row checksum (an older release's "crc32c")
// gets no checks, and the log says why: never a pull checked against sums
// computed with another function.
func TestAPeerOfferingAnotherChecksumIsNotVerifiedAndLogged(t *testing.T) {
	p := newPair(t)
	for range 32 {
		fromA, fromB := p.a.take(), p.b.take()
		if len(fromA) == 0 && len(fromB) == 0 {
			break
		}
		for _, m := range fromA {
			if c, ok := m.(*protocol.Connect); ok && c.PeerKV != nil {
				c.PeerKV.Verify = "crc32c"
			}
			p.sb.Handle(m)
		}
		for _, m := range fromB {
			p.sa.Handle(m)
		}
	}
	require.True(t, p.sb.Ready())
	assert.False(t, p.sb.Verifies())
	assert.Contains(t, strings.Join(p.b.logs, "\n"),
		`offers the row checksum "crc32c", this node "xxh3": pulls between them are not verified`)
}

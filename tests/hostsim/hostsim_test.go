package hostsim

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/peerkv/peerkv/core/tier"
)

func TestAnswerHitsTheHeldKeysAndPinsTheirRowsInOrder(t *testing.T) {
	held := Rows(map[string]int{"b": 7, "d": 3})
	results, pins := Answer([][]byte{[]byte("a"), []byte("b"), []byte("c"), []byte("d")}, held)
	assert.Equal(t, []tier.LookupResult{tier.Miss, tier.Hit, tier.Miss, tier.Hit}, results)
	assert.Equal(t, []int64{7, 3}, pins)
}

func TestAnswerTellsHeldTheHitsBeforeEachKey(t *testing.T) {
	var before []int
	prefixOnly := func(_ []byte, hitsBefore int) (int64, bool) {
		before = append(before, hitsBefore)
		return int64(hitsBefore), hitsBefore < 2 // the host holds a two-key prefix
	}
	results, pins := Answer([][]byte{[]byte("a"), []byte("b"), []byte("c")}, prefixOnly)
	assert.Equal(t, []tier.LookupResult{tier.Hit, tier.Hit, tier.Miss}, results)
	assert.Equal(t, []int64{0, 1}, pins)
	assert.Equal(t, []int{0, 1, 2}, before)
}

func TestANilHeldHoldsNothing(t *testing.T) {
	results, pins := Answer([][]byte{[]byte("a"), []byte("b")}, nil)
	assert.Equal(t, []tier.LookupResult{tier.Miss, tier.Miss}, results)
	assert.Empty(t, pins)
}

func TestCountNumbersPinJobsFromTheHostsOneCounter(t *testing.T) {
	next := int64(41) // the host's last job id, a load's
	pins := Count(&next)
	assert.EqualValues(t, 42, pins.Next("r1"))
	pins.Refused(42) // nothing to give back: the id is not reused
	assert.EqualValues(t, 43, pins.Next("r2"))
	assert.EqualValues(t, 43, next, "the host's counter moved with its pins")
}

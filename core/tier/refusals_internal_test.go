package tier

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// Refused connects under thousands of made-up ids (anyone can send them)
// cannot push a looping stock peer out of its pace: a record that owes
// nothing gives its place.
func TestMadeUpIDsCannotTakeALoopingPeersPace(t *testing.T) {
	var r refusals
	now := time.Now()
	for i := range maxPacedPeers {
		assert.True(t, r.goodbyeNow(fmt.Sprintf("127.0.0.3:%d", 10000+i), now))
	}
	assert.True(t, r.goodbyeNow("127.0.0.3:7994", now), "its first goodbye goes at once")
	assert.False(t, r.goodbyeNow("127.0.0.3:7994", now.Add(time.Millisecond)), "the connect it drew waits for the pace")
	assert.Len(t, r.paced, maxPacedPeers)
}

// Only when every record owes a goodbye does a newcomer go unpaced, and it
// still hears at once: no refusal goes unanswered.
func TestATableOfDebtsStillAnswersANewcomer(t *testing.T) {
	var r refusals
	now := time.Now()
	for i := range maxPacedPeers {
		id := fmt.Sprintf("127.0.0.3:%d", 10000+i)
		r.goodbyeNow(id, now)
		r.goodbyeNow(id, now)
	}
	assert.True(t, r.goodbyeNow("127.0.0.3:7994", now))
	assert.True(t, r.goodbyeNow("127.0.0.3:7994", now))
	assert.Len(t, r.dueGoodbyes(now.Add(goodbyePace)), maxPacedPeers, "every debt is paid at the pace's end")
}

// Strangers cannot disarm the quiet refusal of a stock peer we dialed:
// only our own dials arm one, in a table of their own.
func TestQuietRefusalsAreKeptApartFromThePace(t *testing.T) {
	var r refusals
	now := time.Now()
	r.quiet = map[string]time.Time{"127.0.0.1:7996": now.Add(quietRefusalWindow)}
	for i := range 2 * maxPacedPeers {
		r.goodbyeNow(fmt.Sprintf("127.0.0.3:%d", 10000+i), now)
	}
	assert.True(t, r.take("127.0.0.1:7996", now))
	assert.False(t, r.take("127.0.0.1:7996", now), "used up")
}

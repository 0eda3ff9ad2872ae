package tier

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/control"
	"github.com/peerkv/peerkv/core/session"
)

// Reports are applied in the order they came, those made while applying
// included, each once; a poisoned tier drops them.
func TestIntakeHandsReportsOverInOrderOnce(t *testing.T) {
	var in intake
	in.report(session.Report{JobID: 1})
	in.report(session.Report{JobID: 2})
	var got []int64
	for r, ok := in.nextReport(); ok; r, ok = in.nextReport() {
		got = append(got, r.JobID)
		if r.JobID == 1 {
			in.report(session.Report{JobID: 3}) // applying one may make another
		}
	}
	assert.Equal(t, []int64{1, 2, 3}, got)
	assert.False(t, in.hasReports())

	in.report(session.Report{JobID: 4})
	in.dropReports()
	_, ok := in.nextReport()
	assert.False(t, ok, "dropped reports are never applied")
}

// What a goroutine hands the loop once the tier stopped is dropped, not
// waited on.
func TestIntakeToLoopDoesNotBlockOnceStopped(t *testing.T) {
	in := intake{found: make(chan func(), 1)}
	stop := make(chan struct{})
	in.toLoop(func() {}, stop)
	require.Len(t, in.found, 1)
	close(stop)
	in.toLoop(func() {}, stop) // the channel is full: only stop lets it return
	assert.Len(t, in.found, 1)
}

// lanesRig is lanes with sessions to queue frames for, and the sessions
// they had ended.
type lanesRig struct {
	lanes lanes
	ended map[*session.Session]string
	env   *session.Env
}

func newLanesRig(t *testing.T) *lanesRig {
	return &lanesRig{lanes: newLanes(1 << 20), ended: map[*session.Session]string{}, env: newDeskHarness(t, nil).env}
}

func (r *lanesRig) session(peerID string) *session.Session {
	return session.New(r.env, peerID, "10.0.0.1", false)
}

func (r *lanesRig) queue(s *session.Session, n int) bool {
	ev := control.Event{Kind: control.EventFrame, PeerID: s.PeerID(), Frame: make([]byte, n)}
	return r.lanes.queue(ev, s, func(s *session.Session, why string) {
		r.ended[s] = why
		r.lanes.dropSession(s)
	})
}

// held is what the lanes hold, counted lane by lane: it must equal bytes.
func (r *lanesRig) held() int {
	n := 0
	for _, ln := range r.lanes.byPeer {
		n += ln.bytes()
	}
	return n
}

// A session's large frame, and its frames behind it, wait in its lane;
// lanes take turns a frame at a time; what they hold is accounted for to
// the byte through drops and decodes.
func TestLanesTakeTurnsAndAccountForEveryByte(t *testing.T) {
	r := newLanesRig(t)
	a, b := r.session("10.0.0.1:1"), r.session("10.0.0.2:1")

	assert.False(t, r.queue(a, 100), "a small frame of a session with nothing waiting is handled at once")
	require.True(t, r.queue(a, laneFrameBytes))
	require.True(t, r.queue(a, 100), "a small frame behind a large one waits behind it")
	require.True(t, r.queue(b, laneFrameBytes))
	assert.Equal(t, r.held(), r.lanes.bytes)

	var order []string
	for {
		ln, ev, ok := r.lanes.next()
		if !ok {
			break
		}
		order = append(order, fmt.Sprintf("%s/%d", ev.PeerID, len(ev.Frame)))
		assert.True(t, r.lanes.decoded(ln))
		r.lanes.handled(ln)
		assert.Equal(t, r.held(), r.lanes.bytes)
	}
	assert.Equal(t, []string{
		fmt.Sprintf("10.0.0.1:1/%d", laneFrameBytes), fmt.Sprintf("10.0.0.2:1/%d", laneFrameBytes), "10.0.0.1:1/100",
	}, order, "one frame per lane in turn, each lane's in order")
	assert.Zero(t, r.lanes.bytes)
	assert.Empty(t, r.lanes.byPeer, "an emptied lane is forgotten: the session's next frame is handled at once")

	// A lane dropped while the worker decodes its frame: that frame is not
	// handled, and its bytes are given back when it is done.
	require.True(t, r.queue(a, laneFrameBytes))
	require.True(t, r.queue(a, laneFrameBytes))
	ln, _, ok := r.lanes.next()
	require.True(t, ok)
	r.lanes.dropSession(a)
	assert.Equal(t, laneCost(make([]byte, laneFrameBytes)), r.lanes.bytes, "only the frame being decoded is held")
	assert.False(t, r.lanes.decoded(ln), "a dropped lane's frame is not handled")
	assert.Zero(t, r.lanes.bytes)
	_, _, ok = r.lanes.next()
	assert.False(t, ok)
}

// Past the per-session bound the session ends; past the total bound the
// session holding the most ends first.
func TestLanesEndTheSessionsThatHoldTooMuch(t *testing.T) {
	r := newLanesRig(t)
	flood := r.session("10.0.0.1:1")
	for r.queue(flood, laneFrameBytes) && r.ended[flood] == "" {
		require.LessOrEqual(t, r.lanes.bytes, r.lanes.laneSessionBytes())
	}
	assert.Contains(t, r.ended[flood], "arrive faster than they are decoded")
	assert.Zero(t, r.lanes.bytes, "the ended session's frames are let go")

	// Sessions each under their own bound, all together over the total.
	var ss []*session.Session
	for i := 0; r.lanes.bytes+laneCost(make([]byte, laneFrameBytes)) <= r.lanes.laneTotalBytes(); i++ {
		s := r.session(fmt.Sprintf("10.0.1.%d:1", i%3))
		if i < 3 {
			ss = append(ss, s)
		} else {
			s = ss[i%3]
		}
		require.True(t, r.queue(s, laneFrameBytes))
	}
	most, before := 0, map[*session.Session]int{}
	for _, s := range ss {
		before[s] = r.lanes.byPeer[s.PeerID()].bytes()
		most = max(most, before[s])
	}
	newcomer := r.session("10.0.2.1:1")
	require.True(t, r.queue(newcomer, laneFrameBytes))
	var ended []*session.Session
	for _, s := range ss {
		if r.ended[s] != "" {
			ended = append(ended, s)
		}
	}
	require.Len(t, ended, 1, "one session ends to make room")
	assert.Equal(t, most, before[ended[0]], "the one holding the most")
	assert.Contains(t, r.ended[ended[0]], "this session's hold the most")
	assert.Empty(t, r.ended[newcomer], "the newcomer's frame waits in its lane")
	assert.LessOrEqual(t, r.lanes.bytes, r.lanes.laneTotalBytes())
	assert.Equal(t, r.held(), r.lanes.bytes)
}

package session

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/protocol"
)

// FuzzSession drives one handshaked session with a sequence of wire
// messages from the peer interleaved with host calls and clock ticks, all
// chosen by the input. Whatever the sequence: no panic, no job reported
// twice (the fake owner fails the test), the producer's running totals
// match a recount after every step, and after Close every job the host
// handed the session is reported exactly once. Data writes into the peer's
// first half of rows succeed, later ones fail, so transfers run and end
// either way while the input goes on.
func FuzzSession(f *testing.F) {
	f.Add([]byte{0, 1, 2, 7, 1, 9, 9, 9})
	f.Add([]byte{7, 0, 0, 1, 0, 0, 9, 4, 3, 3})
	f.Add([]byte{8, 1, 6, 1, 4, 1, 5, 2, 2, 9, 9})
	f.Add([]byte{1, 2, 1, 2, 3, 2, 7, 2, 11, 11, 9})
	f.Fuzz(func(t *testing.T, in []byte) {
		p := newPair(t, func(c *config.Config) {
			c.MaxRequestsPerPeer, c.MaxKeysPerPeer = 8, 32
			c.LookupTimeout, c.LoadTimeout, c.StoreTimeout = time.Second, time.Second, time.Second
			c.AbortAckTimeout, c.UnboundStoreTimeout, c.InboundLookupTimeout = time.Second, time.Second, time.Second
		})
		p.pump()
		require.True(t, p.sb.Ready())
		s, o := p.sb, p.b
		o.reachData(s.PeerID(), testRows/2)
		submitted := map[int64]bool{} // job -> is a load
		next := int64(0)
		at := 0
		byteAt := func() int {
			if at >= len(in) {
				return 0
			}
			at++
			return int(in[at-1])
		}
		kv := func() string { return fmt.Sprint("kv", byteAt()%3) }
		keys := func() [][]byte {
			n := 1 + byteAt()%3
			out := make([][]byte, n)
			for i := range out {
				out[i] = key(byteAt() % 4)
			}
			return out
		}
		rows := func(n int) []uint64 {
			out := make([]uint64, n)
			for i := range out {
				out[i] = uint64(byteAt() % (testRows + 2)) // sometimes out of range
			}
			return out
		}
		for at < len(in) && at < 512 {
			switch byteAt() % 13 {
			case 0:
				s.Handle(&protocol.Lookup{KVRequestID: kv(), Keys: keys(), RoundSeq: uint64(byteAt() % 3)})
			case 1:
				k := keys()
				s.Handle(&protocol.Fetch{KVRequestID: kv(), Keys: k, BlockIndexes: rows(len(k)), RoundSeq: uint64(byteAt() % 3)})
			case 2:
				s.Handle(&protocol.Fetch{KVRequestID: kv(), Keys: [][]byte{}, BlockIndexes: []uint64{}, RoundSeq: uint64(byteAt() % 3)})
			case 3:
				s.Handle(&protocol.AbortFetch{KVRequestID: kv(), RoundSeq: uint64(byteAt() % 3)})
			case 4:
				s.Handle(&protocol.TransferDone{KVRequestID: kv(), Success: byteAt()%2 == 0, RoundSeq: uint64(byteAt() % 3)})
			case 5:
				s.Handle(&protocol.AbortAck{KVRequestID: kv(), RoundSeq: uint64(byteAt() % 3)})
			case 6:
				k := keys()
				hits := make([]bool, len(k))
				for i := range hits {
					hits[i] = byteAt()%2 == 0
				}
				s.Handle(&protocol.LookupResp{KVRequestID: kv(), Keys: k, Hits: hits})
			case 7:
				next++
				k := keys()
				submitted[next] = false
				s.AddStoredBlocks(kv(), k, rows(len(k)), next, 0, false)
			case 8:
				next++
				k := keys()
				r := rows(len(k))
				for i := range r {
					r[i] %= testRows
				}
				submitted[next] = true
				s.RequestBlocks(next, kv(), k, r)
			case 9:
				o.tick(time.Duration(byteAt()) * 10 * time.Millisecond)
			case 10:
				answerInbound(s, o, &next, submitted, byteAt())
			case 11:
				if byteAt()%2 == 0 {
					s.FinishProducer(kv())
				} else {
					s.FinishConsumer(kv())
				}
			case 12:
				drainCompletions(s, o)
			}
			checkHoldings(t, s)
			if s.Dead() {
				break
			}
		}
		drainCompletions(s, o)
		checkHoldings(t, s)
		s.Close("fuzz end", Failure)
		s.Release()
		checkHoldings(t, s)
		require.Zero(t, s.producer.held, "a closed session holds nothing")
		for job, isLoad := range submitted {
			reported := o.stores
			if isLoad {
				reported = o.loads
			}
			_, ok := reported[job]
			require.True(t, ok, "job %d (load %v) never reported", job, isLoad)
		}
	})
}

// answerInbound plays the host for the oldest unanswered inbound lookup.
func answerInbound(s *Session, o *fakeOwner, next *int64, submitted map[int64]bool, choice int) {
	for _, l := range o.inbound {
		if l.state == inboundDone || l.CheckedOut() {
			continue
		}
		answers := make([]Answer, len(l.Pending()))
		var pins []uint64
		for i := range answers {
			answers[i] = Answer((choice + i) % 3)
			if answers[i] == AnswerHit {
				pins = append(pins, uint64(i))
			}
		}
		job := int64(-1)
		if len(pins) > 0 {
			*next++
			job = *next
			submitted[job] = false
		}
		l.CheckOut()
		if _, err := s.AnswerLookup(l, answers, job, pins); err != nil {
			panic(err) // answers are well formed here
		}
		return
	}
}

// drainCompletions applies the data path's finished transfers, waiting
// (briefly) only while some are still running.
func drainCompletions(s *Session, o *fakeOwner) {
	for len(s.producer.transfers) > 0 {
		select {
		case c := <-o.env.Data.Completions():
			s.Complete(data.Completion{ID: c.ID, Err: c.Err})
		case <-time.After(20 * time.Millisecond):
			return
		}
	}
}

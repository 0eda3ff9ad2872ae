package session

import (
	"fmt"
	"strings"

	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/protocol"
)

// How says how a session ends: whether the peer is told with a goodbye, and
// how the owner logs the end. Close takes one of Orderly, Failure (the zero
// How), Dropped or Unreached; the session's own ends use the rest.
type How struct {
	kind howKind
	// Unreached only: the transport's word for why, and whether it is a guess.
	connectCause  string
	connectUnsure bool
}

type howKind int8

const (
	failure     howKind = iota // a goodbye; the owner logs the reason as a warning
	orderly                    // a goodbye; normal lifecycle, logged at INFO
	dropped                    // no goodbye: the connection is gone or cannot carry one
	unreached                  // no goodbye: we dialed and never reached the peer
	peerLeft                   // the peer said goodbye after the handshake: orderly, none back
	peerRefused                // the peer said goodbye during the handshake: it refused us
	refusal                    // we refused the handshake: a goodbye, none to a stock peer refused quietly
)

var (
	// Orderly ends a session as normal lifecycle (idle, replaced): the peer
	// gets a goodbye; the owner logs the reason at INFO.
	Orderly = How{kind: orderly}
	// Failure ends a session because something went wrong: the peer gets a
	// goodbye; the owner logs the reason as a warning.
	Failure = How{kind: failure}
	// Dropped ends a session without a goodbye: its connection is gone or
	// unusable (lost, a send failed, a lane overflowed), or a goodbye would
	// reach the wrong peer (one that restarted). The owner logs a warning.
	Dropped = How{kind: dropped}
)

// Unreached ends a session we dialed whose connection never came up; cause
// is the transport's (control.ConnectFailureCauses), unsure when it is only
// a guess. No goodbye; the owner names why once per peer and episode.
func Unreached(cause string, unsure bool) How {
	return How{kind: unreached, connectCause: cause, connectUnsure: unsure}
}

// ending is how the session ended: recorded once, by end, and read by the
// owner after the Ended report.
type ending struct {
	dead   bool
	how    How
	reason string
	// logged: the line that said why was logged where it happened (a
	// rejection, a protocol error, a handshake timeout), so the owner does
	// not log it again.
	logged bool
	// rejectCause: the handshake failed, one of RejectionCauses ("" if not).
	rejectCause string
	// refused: the fields of our connect the peer refused, as it named them.
	refused []string
	// unheard: the handshake timed out and nothing ever came from the peer
	// we dialed: unreached, for a reason nobody knows.
	unheard bool
	// named: a refusal's goodbye names these fields (a peerkv peer only).
	named []string
}

func (e *ending) orderly() bool { return e.how.kind == orderly || e.how.kind == peerLeft }

// connectFailed: see Session.ConnectFailed.
func (e *ending) connectFailed() (cause string, unsure, failed bool) {
	switch {
	case e.how.kind == unreached:
		return e.how.connectCause, e.how.connectUnsure, true
	case e.unheard:
		return "", true, true
	}
	return "", false, false
}

// goodbye is what the peer is told of the end, nil for nothing.
func (e *ending) goodbye(quiet bool) *protocol.Disconnect {
	switch e.how.kind {
	case failure, orderly:
		return &protocol.Disconnect{}
	case refusal:
		if quiet {
			return nil
		}
		return &protocol.Disconnect{Refused: e.named}
	}
	return nil
}

// end is the one place a session ends: it records e, the first end only
// (a later one changes nothing), tells the peer as e's How says, and
// reports Ended. What the session holds stays until the owner's Release.
func (s *Session) end(e ending) {
	if s.ended.dead {
		return
	}
	if bye := e.goodbye(s.hs.refusesQuietly()); bye != nil {
		// Sent while the session still lives: the owner's Send reads its state.
		_ = s.env.Send(s.peerID, bye)
		if s.ended.dead {
			return // ended meanwhile (the owner's Send ended it): that end was the first
		}
	}
	e.dead = true
	s.ended = e
	s.report(Report{Kind: Ended})
}

// Close ends the session as how says, with reason for the owner's log: the
// one way to end a session from outside. Only the first end counts; later
// ones change nothing. The owner then calls Release, at once or when it
// forgets the session.
func (s *Session) Close(reason string, how How) {
	s.end(ending{how: how, reason: reason})
}

// Release frees what an ended session holds: every job it holds is
// reported failed, every consumer request with work toward this peer
// failed, every inbound lookup finished, and its data-path grants revoked.
// It ends nothing: a live session is left as it is. Idempotent.
func (s *Session) Release() {
	if !s.ended.dead {
		return
	}
	s.hs.dropQueued()
	if gr, ok := s.env.Data.(data.Granter); ok && s.grants != (data.Grants{}) {
		gr.Revoke(s.peerID, s.grants)
		s.grants = data.Grants{}
	}
	s.consumer.close()
	s.producer.close()
}

// refuse ends a handshake we refused for cause, whose reason was logged
// already: with a goodbye naming fields (a peerkv peer), or none to a stock
// peer refused quietly.
func (s *Session) refuse(cause, reason string, named []string) {
	s.end(ending{how: How{kind: refusal}, reason: reason, logged: true, rejectCause: cause, named: named})
}

// reject refuses the peer for cause: one line logged, goodbye sent (unless
// quiet), session dead.
func (s *Session) reject(cause, format string, args ...any) error {
	reason := fmt.Sprintf(format, args...)
	s.env.Logf(s.failLevel(), "rejecting %s: %s", s.describe(), reason)
	var named []string
	if s.hs.probed && cause == CauseAuth {
		// A probe is told which check failed, never why: whoever runs it
		// acts on "auth_secret"; the values stay here.
		named = []string{"auth_secret"}
	}
	s.refuse(cause, "rejected its connect: "+reason, named)
	return nil
}

// protocolError ends the session for a frame the peer should not have sent.
func (s *Session) protocolError(reason string) {
	s.env.Logf(s.failLevel(), "%s: protocol error: %s; disconnecting", s.describe(), reason)
	e := ending{how: Failure, reason: "protocol error: " + reason, logged: true}
	if !s.Ready() {
		e.rejectCause = CauseProtocol
	}
	s.end(e)
}

// peerSaidGoodbye ends the session on the peer's disconnect: orderly after
// the handshake, a refusal of our connect before it.
func (s *Session) peerSaidGoodbye(m *protocol.Disconnect) {
	if s.Ready() {
		s.end(ending{how: How{kind: peerLeft}, reason: "it closed the session"})
		return
	}
	e := ending{how: How{kind: peerRefused}, rejectCause: CauseRefusedByPeer, refused: m.Refused}
	if len(m.Refused) > 0 {
		e.reason = fmt.Sprintf("it refused our connect, naming as different from its own: %s (its log has the values)",
			strings.Join(m.Refused, ", "))
	} else {
		e.reason = "it refused our connect (its log names why: block_len, config fingerprint, hash seed, " +
			"auth secret, or its session limits)"
	}
	s.end(e)
}

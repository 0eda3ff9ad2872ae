package tier

import (
	"fmt"
	"time"

	"github.com/peerkv/peerkv/core/session"
)

// ProbeResult is what a handshake-only probe of a peer learned
// (`peerkv doctor`).
type ProbeResult struct {
	Peer string `json:"peer"`
	// Connect is the peer's connect as it arrived; absent when the peer
	// refused ours first (a peerkv peer answers a stranger only once its
	// connect passed) or never answered.
	Connect   *session.PeerConnect `json:"connect,omitempty"`
	Handshake bool                 `json:"handshake"`         // both sides accepted each other
	Refused   []string             `json:"refused,omitempty"` // our fields the peer named as refused
	Cause     string               `json:"cause,omitempty"`   // why the handshake failed (a rejection cause)
	Reason    string               `json:"reason,omitempty"`  // what ended the session before the handshake
	// ConnectCause is why no connection to the peer came up, when none
	// did (one of control.ConnectFailureCauses).
	ConnectCause string  `json:"connect_cause,omitempty"`
	RTTms        float64 `json:"rtt_ms"` // our connect sent until its connect (or refusal) arrived
}

// Probe opens a session to peerID only for the handshake and closes it
// orderly: the peer sees a connect and a goodbye, nothing else. It waits up
// to timeout (polling: probes are rare and run off the host's hot path).
func (t *Tier) Probe(peerID string, timeout time.Duration) (ProbeResult, error) {
	t.mu.Lock()
	if err := t.life.usable(); err != nil {
		t.mu.Unlock()
		return ProbeResult{}, err
	}
	if t.peers.session(peerID) != nil {
		t.mu.Unlock()
		return ProbeResult{}, fmt.Errorf("%w: a session with %s is open already; probe from a peer of its own",
			ErrInvalidArgument, peerID)
	}
	s, err := t.dial(peerID, true)
	start := t.now()
	t.mu.Unlock()
	if err != nil {
		return ProbeResult{Peer: peerID, Reason: err.Error()}, nil
	}
	for {
		t.mu.Lock()
		now := t.now()
		// A connect that failed is named by a diagnosis that may still run:
		// its words are the probe's answer.
		naming := t.peers.unreach.naming(peerID) && s.Dead()
		if (s.Dead() || s.Ready() || !now.Before(start.Add(timeout))) && (!naming || !now.Before(start.Add(timeout))) {
			res := probeResult(peerID, s, start, now)
			if why := t.peers.unreach.why(peerID); s.Dead() && why != "" {
				res.Reason, res.ConnectCause = why, t.peers.unreach.peers[peerID].cause
			}
			if !s.Dead() {
				s.Close("probe finished", session.Orderly)
				s.Release()
				t.settle()
			}
			t.mu.Unlock()
			return res, nil
		}
		t.mu.Unlock()
		time.Sleep(2 * time.Millisecond)
	}
}

func probeResult(peerID string, s *session.Session, start, now time.Time) ProbeResult {
	res := ProbeResult{Peer: peerID, Handshake: s.Ready(), Refused: s.Refused(), Cause: s.RejectCause()}
	answered := now
	if c, ok := s.Seen(); ok {
		res.Connect = &c
		answered = c.At
	}
	switch {
	case s.Dead() && !res.Handshake:
		res.Reason = s.DeathReason()
	case !s.Dead() && !res.Handshake:
		res.Reason = fmt.Sprintf("no complete handshake within %v", now.Sub(start).Round(time.Millisecond))
	}
	if res.Connect != nil || len(res.Refused) > 0 || res.Handshake {
		res.RTTms = float64(answered.Sub(start).Microseconds()) / 1000
	}
	return res
}

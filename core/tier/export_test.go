package tier

import (
	"context"
	"net"
)

// PanicNext makes the named goroutine ("loop" or "registration") panic on
// its next step.
func PanicNext(where string) { panicAt.Store(&where) }

// InlineAsk is how many keys a host call registers itself (more are left to
// the loop).
const InlineAsk = inlineAsk

// FramesDecoded is how many inbound frames were decoded past their type.
func (t *Tier) FramesDecoded() int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.stats.framesDecoded
}

// StubResolver makes dialed host names resolve to addrs until restore.
func StubResolver(addrs map[string][]string) (restore func()) {
	prev := resolveHost
	resolveHost = func(_ context.Context, host string) ([]string, error) {
		if a, ok := addrs[host]; ok {
			return a, nil
		}
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	return func() { resolveHost = prev }
}

// BeforeCheck runs f before each verified load's rows are checked where
// they landed.
func (t *Tier) BeforeCheck(f func(rows []uint64)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.checks.before = f
}

// BeforeSend runs f after each summed write's sums were taken and before
// its transfer starts.
func (t *Tier) BeforeSend(f func(peerID string, src []uint64)) { t.rows.SetBeforeSend(f) }

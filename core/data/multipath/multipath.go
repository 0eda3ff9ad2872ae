// Package multipath serves several data paths at once (same-host shm,
// NIXL, TCP) and picks one per peer: shm to peerkv peers on this host, NIXL
// to stock vLLM peers and to peerkv peers that have it, TCP to peerkv peers
// that offer only TCP.
//
// The choice is made at AddPeer, in the order the paths were given: the
// first path the peer's connect offers (a same-host offer for shm, agent
// metadata for NIXL, a data address for TCP) and that accepts the peer
// wins; a path that fails to register the peer (another host, a refused
// grant, NIXL error) falls through to the next. Every advertised field of
// every path goes into our connect, so the peer can choose too; Grant and
// Revoke reach every path that grants peers access (data.Granter).
package multipath

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/peerkv/peerkv/core/data"
)

// maxPaths bounds the paths: transfer ids carry the path index in their low
// bits.
const maxPaths = 4

const indexBits = 2

// forwardWait bounds Close's wait for the paths' completion channels.
const forwardWait = 5 * time.Second

// Transport is a data.Transport over several paths.
type Transport struct {
	paths []data.Transport
	// missing explains paths this host could not provide; it ends the
	// error for a peer we share no path with.
	missing string

	mu      sync.Mutex
	chosen  map[string]int    // peer -> index into paths
	refused map[string]string // peer -> why paths it offered ahead of the chosen one failed

	outbox    *data.Outbox
	forwarded sync.WaitGroup
	closeOnce sync.Once
	closeErr  error
}

// New combines paths, most preferred first. missing ("" if nothing) says
// which path this host lacks and why, for operators reading a refusal.
func New(missing string, paths ...data.Transport) (*Transport, error) {
	if len(paths) == 0 || len(paths) > maxPaths {
		return nil, fmt.Errorf("multipath: need 1..%d paths, got %d", maxPaths, len(paths))
	}
	t := &Transport{
		paths:   paths,
		missing: missing,
		chosen:  map[string]int{},
		refused: map[string]string{},
		outbox:  data.NewOutbox(1024),
	}
	for i, p := range paths {
		t.forwarded.Add(1)
		go t.forward(i, p.Completions())
	}
	return t, nil
}

// forward relabels one path's completions with combined ids.
func (t *Transport) forward(index int, in <-chan data.Completion) {
	defer t.forwarded.Done()
	for c := range in {
		c.ID = c.ID<<indexBits | uint64(index)
		t.outbox.Send(c)
	}
}

// Name lists the paths, e.g. "nixl+tcp".
func (t *Transport) Name() string {
	names := make([]string, len(t.paths))
	for i, p := range t.paths {
		names[i] = p.Name()
	}
	return strings.Join(names, "+")
}

// AgentMetadata is the NIXL path's metadata (nil without one).
func (t *Transport) AgentMetadata() []byte {
	for _, p := range t.paths {
		if md := p.AgentMetadata(); len(md) > 0 {
			return md
		}
	}
	return nil
}

// DataAddr is the TCP path's listener ("" without one).
func (t *Transport) DataAddr() string {
	for _, p := range t.paths {
		if a := p.DataAddr(); a != "" {
			return a
		}
	}
	return ""
}

var _ data.Granter = (*Transport)(nil)

// Grant collects what every granting path gives peerID.
func (t *Transport) Grant(peerID string, g *data.Grants) {
	for _, p := range t.paths {
		if gr, ok := p.(data.Granter); ok {
			gr.Grant(peerID, g)
		}
	}
}

// Revoke withdraws g on every granting path; each revokes its own field.
func (t *Transport) Revoke(peerID string, g data.Grants) {
	for _, p := range t.paths {
		if gr, ok := p.(data.Granter); ok {
			gr.Revoke(peerID, g)
		}
	}
}

// Offers reports whether a peer's connect offers the path named name.
func Offers(name string, info data.PeerInfo) bool {
	switch name {
	case "shm":
		return info.SameHost != ""
	case "nixl":
		return len(info.AgentMetadata) > 0
	case "tcp":
		return info.DataAddr != ""
	}
	return true // paths without an advertised field (tests) take anyone
}

// AddPeer registers the peer on the first path both sides have.
func (t *Transport) AddPeer(peerID string, info data.PeerInfo) error {
	var why, refused []string
	for i, p := range t.paths {
		if !Offers(p.Name(), info) {
			why = append(why, fmt.Sprintf("the peer offers no %s path", p.Name()))
			continue
		}
		if err := p.AddPeer(peerID, info); err != nil {
			why = append(why, fmt.Sprintf("%s: %v", p.Name(), err))
			if !errors.Is(err, data.ErrNotReachable) { // a peer on another host is no reason to warn
				refused = append(refused, fmt.Sprintf("%s: %v", p.Name(), err))
			}
			continue
		}
		t.mu.Lock()
		old, had := t.chosen[peerID]
		t.chosen[peerID] = i
		t.refused[peerID] = strings.Join(refused, "; ")
		t.mu.Unlock()
		if had && old != i {
			t.paths[old].RemovePeer(peerID)
		}
		return nil
	}
	if t.missing != "" {
		why = append(why, t.missing)
	}
	return fmt.Errorf("no data path shared with peer %s: %s", peerID, strings.Join(why, "; "))
}

// PathTo names the path serving peerID ("" if none).
func (t *Transport) PathTo(peerID string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	if i, ok := t.chosen[peerID]; ok {
		return t.paths[i].Name()
	}
	return ""
}

// Fence implements data.Fencer for every path that can be fenced.
func (t *Transport) Fence(peerID string) {
	for _, p := range t.paths {
		if f, ok := p.(data.Fencer); ok {
			f.Fence(peerID)
		}
	}
}

// WritesUnguarded implements data.Unguarded: true when any path may have
// written into us around the guard, or cannot say.
func (t *Transport) WritesUnguarded() bool {
	for _, p := range t.paths {
		if u, ok := p.(data.Unguarded); !ok || u.WritesUnguarded() {
			return true
		}
	}
	return false
}

// Cancel implements data.Canceler: it cancels on the path that runs the
// transfer, if that path can.
func (t *Transport) Cancel(peerID string, id uint64) {
	i := int(id & (1<<indexBits - 1))
	if i >= len(t.paths) {
		return
	}
	if c, ok := t.paths[i].(data.Canceler); ok {
		c.Cancel(peerID, id>>indexBits)
	}
}

// Refused says why paths peerID offered ahead of its chosen one could not
// serve it ("" if none did), so an operator sees why a faster path is idle.
func (t *Transport) Refused(peerID string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.refused[peerID]
}

// RemovePeer forgets the peer on its path; its running transfers fail.
func (t *Transport) RemovePeer(peerID string) {
	t.mu.Lock()
	i, ok := t.chosen[peerID]
	delete(t.chosen, peerID)
	delete(t.refused, peerID)
	t.mu.Unlock()
	if ok {
		t.paths[i].RemovePeer(peerID)
	}
}

// Write starts the transfer on the peer's path.
func (t *Transport) Write(peerID string, src, dst []uint64) (uint64, error) {
	t.mu.Lock()
	i, ok := t.chosen[peerID]
	t.mu.Unlock()
	if !ok {
		return 0, fmt.Errorf("%w: %s", data.ErrUnknownPeer, peerID)
	}
	// Paths number transfers from a counter, far below 2^62.
	id, err := t.paths[i].Write(peerID, src, dst)
	if err != nil {
		return 0, err
	}
	return id<<indexBits | uint64(i), nil
}

// WriteSummed implements data.Summer: the peer's path sums the write if it
// can (data.ErrNotSummed otherwise, nothing started).
func (t *Transport) WriteSummed(peerID string, src, dst []uint64) (uint64, error) {
	t.mu.Lock()
	i, ok := t.chosen[peerID]
	t.mu.Unlock()
	if !ok {
		return 0, fmt.Errorf("%w: %s", data.ErrUnknownPeer, peerID)
	}
	s, ok := t.paths[i].(data.Summer)
	if !ok {
		return 0, data.ErrNotSummed
	}
	id, err := s.WriteSummed(peerID, src, dst)
	if err != nil {
		return 0, err
	}
	return id<<indexBits | uint64(i), nil
}

// SetBetweenReads implements data.Summer for every path that sums.
func (t *Transport) SetBetweenReads(f func(peerID string, src []uint64)) {
	for _, p := range t.paths {
		if s, ok := p.(data.Summer); ok {
			s.SetBetweenReads(f)
		}
	}
}

// Completions delivers every path's outcomes, each once.
func (t *Transport) Completions() <-chan data.Completion { return t.outbox.C() }

// Close closes every path; their failed transfers are still delivered
// while there is room. Completions is closed once every path's is, or
// after forwardWait if a path never closes its own.
func (t *Transport) Close() error {
	t.closeOnce.Do(func() {
		t.outbox.StartClosing()
		var errs []error
		for _, p := range t.paths {
			errs = append(errs, p.Close())
		}
		done := make(chan struct{})
		go func() {
			t.forwarded.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-time.After(forwardWait):
			errs = append(errs, fmt.Errorf("multipath: a path kept its completions open %v after Close", forwardWait))
		}
		t.outbox.Finish() // a late forwarder's Send is then dropped
		t.closeErr = errors.Join(errs...)
	})
	return t.closeErr
}

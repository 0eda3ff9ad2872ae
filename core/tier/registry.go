package tier

import (
	"sync"

	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/session"
)

// registry owns the data path's peer table. Adding a peer can be slow (NIXL
// loads metadata), so it runs off the tier's lock, on one goroutine that
// applies adds and removes in the order they were asked: a session that
// ends before its registration finished still has its peer removed after
// the add, never before it.
type registry struct {
	t    *Tier
	wake chan struct{}
	done chan struct{} // closed when run returns

	mu    sync.Mutex
	ops   []registryOp
	peers map[string]bool // registered with the data path now
}

type registryOp struct {
	s      *session.Session // add when set, else remove peerID
	peerID string
	info   data.PeerInfo
}

func newRegistry(t *Tier) *registry {
	return &registry{t: t, wake: make(chan struct{}, 1), done: make(chan struct{}), peers: map[string]bool{}}
}

func (r *registry) add(s *session.Session, info data.PeerInfo) {
	info = r.t.allowedData(s, info)
	r.push(registryOp{s: s, peerID: s.PeerID(), info: info})
}

func (r *registry) remove(peerID string) { r.push(registryOp{peerID: peerID}) }

func (r *registry) push(op registryOp) {
	r.mu.Lock()
	r.ops = append(r.ops, op)
	r.mu.Unlock()
	select {
	case r.wake <- struct{}{}:
	default:
	}
}

// count is how many peers the data path holds.
func (r *registry) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.peers)
}

func (r *registry) run() {
	t := r.t
	defer close(r.done)
	defer t.recoverLoop("data-path registration")
	for {
		select {
		case <-t.stop:
			return
		case <-r.wake:
		}
		for {
			r.mu.Lock()
			if len(r.ops) == 0 {
				r.mu.Unlock()
				break
			}
			op := r.ops[0]
			r.ops = r.ops[1:]
			r.mu.Unlock()
			if !r.apply(op) {
				return
			}
		}
	}
}

// apply runs one op; false once the tier is stopping.
func (r *registry) apply(op registryOp) bool {
	t := r.t
	if op.s == nil {
		t.dt.RemovePeer(op.peerID)
		r.mu.Lock()
		delete(r.peers, op.peerID)
		r.mu.Unlock()
		return true
	}
	testPanic("registration")
	err := t.dt.AddPeer(op.peerID, op.info)
	if err == nil {
		r.mu.Lock()
		r.peers[op.peerID] = true
		r.mu.Unlock()
		t.logPath(op.s)
	}
	select {
	case t.registered <- registration{op.s, err}:
		return true
	case <-t.stop:
		return false
	}
}

// HasDataPath reports whether peerID is registered with the data path now
// (its "peer …: data path …" line is rate-limited when the peer dialed us).
func (t *Tier) HasDataPath(peerID string) bool {
	t.reg.mu.Lock()
	defer t.reg.mu.Unlock()
	return t.reg.peers[peerID]
}

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
	registryDeps
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

// registryDeps is what the registry's goroutine needs of the tier.
type registryDeps struct {
	dt         data.Transport
	stop       <-chan struct{}           // closed when the tier stops
	registered chan<- registration       // outcomes, for the loop to apply
	crashed    func(where string, v any) // a panic of run's: the tier stops (Tier.crashed)
	logPath    func(s *session.Session)  // says which data path serves s's peer
}

func newRegistry(d registryDeps) *registry {
	return &registry{registryDeps: d, wake: make(chan struct{}, 1), done: make(chan struct{}), peers: map[string]bool{}}
}

// add registers s's peer (info already screened by allowed_peers).
func (r *registry) add(s *session.Session, info data.PeerInfo) {
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
	defer close(r.done)
	defer func() {
		if v := recover(); v != nil {
			r.crashed("data-path registration", v)
		}
	}()
	for {
		select {
		case <-r.stop:
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
	if op.s == nil {
		r.dt.RemovePeer(op.peerID)
		r.mu.Lock()
		delete(r.peers, op.peerID)
		r.mu.Unlock()
		return true
	}
	testPanic("registration")
	err := r.dt.AddPeer(op.peerID, op.info)
	if err == nil {
		r.mu.Lock()
		r.peers[op.peerID] = true
		r.mu.Unlock()
		r.logPath(op.s)
	}
	select {
	case r.registered <- registration{op.s, err}:
		return true
	case <-r.stop:
		return false
	}
}

// HasDataPath reports whether peerID is registered with the data path now
// (its "peer …: data path …" line is rate-limited when the peer dialed us).
func (t *Tier) HasDataPath(peerID string) bool {
	return t.peers.reg.has(peerID)
}

// has reports whether peerID is registered with the data path now.
func (r *registry) has(peerID string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.peers[peerID]
}

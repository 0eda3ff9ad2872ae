package nixl

/*
#include "capi.h"
*/
import "C"

import (
	"errors"
	"fmt"
	"runtime"
	"time"
	"unsafe"

	"github.com/peerkv/peerkv/core/data"
)

// Status polling backs off from minPoll to maxPoll while nothing completes.
const (
	minPoll = 20 * time.Microsecond
	maxPoll = time.Millisecond
)

// call is one piece of work for the owner goroutine.
type call struct {
	fn   func()
	done chan struct{}
}

// do runs fn on the owner goroutine. The calls made there are local NIXL
// operations (no network waits), but both waits are still bounded.
func (t *Transport) do(fn func()) error {
	c := &call{fn: fn, done: make(chan struct{})}
	timer := time.NewTimer(t.opts.CallTimeout)
	defer timer.Stop()
	select {
	case t.calls <- c:
	case <-t.stop:
		return data.ErrClosed
	case <-timer.C:
		return ErrOwnerBusy
	}
	timer.Reset(t.opts.CallTimeout)
	select {
	case <-c.done:
		return nil
	case <-timer.C:
		return fmt.Errorf("nixl transport: a NIXL call has not returned after %v", t.opts.CallTimeout)
	}
}

// run is the owner goroutine. It stays locked to one OS thread for its whole
// life: NIXL binds a UCX worker per calling thread, and the thread is
// discarded afterwards rather than handed to other goroutines.
func (t *Transport) run(started chan<- error) {
	runtime.LockOSThread()
	defer close(t.ownerDone)
	if err := t.init(); err != nil {
		t.completions.close()
		started <- err
		return
	}
	started <- nil
	t.loop()
	t.shutdown()
}

func (t *Transport) init() error {
	o := &t.opts
	a, err := newAgent(o.AgentName, o.agentConfig())
	if err != nil {
		return fmt.Errorf("nixl transport: %w", err)
	}
	fail := func(err error) error {
		_ = a.destroy()
		return fmt.Errorf("nixl transport: %w", err)
	}
	for _, backend := range o.Backends {
		if err := a.createBackend(backend, o.backendParams(backend)); err != nil {
			return fail(err)
		}
	}
	base := uintptr(unsafe.Pointer(&o.Region.Mem[0]))
	if err := a.registerDRAM(base, uint64(len(o.Region.Mem))); err != nil {
		return fail(err)
	}
	local, err := a.prepRows("", base, t.numRows, o.Region.RowLen)
	if err != nil {
		return fail(err)
	}
	md, err := a.localMD()
	if err != nil {
		_ = a.releaseDlist(local)
		return fail(err)
	}
	t.agent, t.local, t.metadata = a, local, md
	return nil
}

func (t *Transport) loop() {
	backoff := minPoll
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		var wake <-chan time.Time
		if len(t.inflight) > 0 || len(t.stuck) > 0 {
			if t.poll() {
				backoff = minPoll
			} else if backoff < maxPoll {
				backoff = min(2*backoff, maxPoll)
			}
			timer.Reset(backoff)
			wake = timer.C
		}
		select {
		case c := <-t.calls:
			c.fn()
			close(c.done)
		case <-t.posts.wake:
			t.runPosts()
		case <-wake:
		case <-t.stop:
			return
		}
	}
}

// poll checks every running transfer once; true if any finished.
func (t *Transport) poll() bool {
	finished := false
	now := time.Now()
	for id, tr := range t.inflight {
		done, err := t.agent.status(tr.req)
		if !done && err == nil {
			if now.Before(tr.deadline) {
				continue
			}
			err = fmt.Errorf("%w after %v", ErrTransferTimeout, t.opts.TransferTimeout)
		}
		t.finish(id, tr, err)
		finished = true
	}
	t.retryStuck()
	return finished
}

// finish releases a transfer's request (cancelling it if still running) and
// reports its outcome.
func (t *Transport) finish(id uint64, tr *transfer, cause error) {
	delete(t.inflight, id)
	if relErr := t.agent.releaseReq(tr.req); relErr != nil {
		t.stuck = append(t.stuck, tr.req)
		if cause != nil {
			cause = fmt.Errorf("%w; request not released, rows may still be written: %v", cause, relErr)
		}
	}
	if cause != nil {
		cause = fmt.Errorf("nixl transport: write to peer %s: %w", tr.peerID, cause)
	}
	t.completions.push(data.Completion{PeerID: tr.peerID, ID: id, Err: cause})
}

func (t *Transport) retryStuck() {
	kept := t.stuck[:0]
	for _, req := range t.stuck {
		if t.agent.releaseReq(req) != nil {
			kept = append(kept, req)
		}
	}
	t.stuck = kept
}

// runPosts posts the queued writes; one that fails is reported at once.
func (t *Transport) runPosts() {
	for _, w := range t.posts.take() {
		if err := t.postWrite(w); err != nil {
			t.completions.push(data.Completion{PeerID: w.peerID, ID: w.id, Err: err})
		}
	}
}

func (t *Transport) postWrite(w post) error {
	p, ok := t.peers[w.peerID]
	if !ok || p.gen != w.gen {
		return fmt.Errorf("nixl transport: write to peer %s: %w (removed before its write was posted)", w.peerID, data.ErrUnknownPeer)
	}
	if waited := time.Since(w.queued); waited > t.opts.CallTimeout {
		return fmt.Errorf("nixl transport: write to peer %s: %w (it waited %v to be posted)", w.peerID, ErrOwnerBusy, waited)
	}
	req, done, err := t.agent.postWrite(t.local, p.dlist, w.src, w.dst)
	if err != nil {
		if req != nil {
			t.stuck = append(t.stuck, req)
		}
		return fmt.Errorf("nixl transport: write to peer %s: %w", w.peerID, err)
	}
	tr := &transfer{peerID: w.peerID, req: req, deadline: time.Now().Add(t.opts.TransferTimeout)}
	if done {
		t.finish(w.id, tr, nil)
	} else {
		t.inflight[w.id] = tr
	}
	return nil
}

func (t *Transport) addPeer(peerID string, info data.PeerInfo) error {
	t.removePeer(peerID, ErrPeerRemoved) // a re-added peer replaces the old one
	name, err := t.agent.loadRemoteMD(info.AgentMetadata)
	if err != nil {
		return fmt.Errorf("nixl transport: peer %s metadata: %w", peerID, err)
	}
	for other, p := range t.peers {
		if p.nixlName == name {
			return fmt.Errorf("nixl transport: peer %s is NIXL agent %s, already added as peer %s", peerID, name, other)
		}
	}
	dlist, err := t.agent.prepRows(name, uintptr(info.BaseAddr), info.NumRows, info.RowLen)
	if err != nil {
		_ = t.agent.invalidateRemote(name)
		return fmt.Errorf("nixl transport: peer %s descriptors: %w", peerID, err)
	}
	gen := t.posts.register(peerID, info.NumRows)
	t.peers[peerID] = &peer{nixlName: name, dlist: dlist, gen: gen}
	return nil
}

// removePeer fails the peer's running transfers with cause, then releases
// its descriptors and metadata. Release errors leave nothing to retry.
func (t *Transport) removePeer(peerID string, cause error) {
	for _, w := range t.posts.forget(peerID) {
		t.completions.push(data.Completion{PeerID: peerID, ID: w.id, Err: fmt.Errorf("nixl transport: write to peer %s: %w before it was posted", peerID, cause)})
	}
	p, ok := t.peers[peerID]
	if !ok {
		return
	}
	for id, tr := range t.inflight {
		if tr.peerID == peerID {
			t.finish(id, tr, fmt.Errorf("%w: transfer cancelled", cause))
		}
	}
	delete(t.peers, peerID)
	_ = t.agent.releaseDlist(p.dlist)
	_ = t.agent.invalidateRemote(p.nixlName)
}

// shutdown runs on the owner goroutine after stop: every running transfer
// fails with ErrClosed, then NIXL resources go in reverse order.
func (t *Transport) shutdown() {
	defer t.completions.close()
	for _, w := range t.posts.close() { // queued, never posted
		t.completions.push(data.Completion{PeerID: w.peerID, ID: w.id, Err: data.ErrClosed})
	}
	for id, tr := range t.inflight {
		t.finish(id, tr, data.ErrClosed)
	}
	for peerID := range t.peers {
		t.removePeer(peerID, data.ErrClosed)
	}
	t.retryStuck()
	errs := []error{t.agent.releaseDlist(t.local)}
	if len(t.stuck) > 0 {
		errs = append(errs, fmt.Errorf("nixl transport: %d transfer requests could not be released", len(t.stuck)))
		t.stuck = nil
	}
	errs = append(errs, t.agent.destroy())
	t.teardownErr = errors.Join(errs...)
}

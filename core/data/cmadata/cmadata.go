// Package cmadata is the same-host data path: the producer copies rows
// straight into the consumer process's region with process_vm_writev
// (Linux cross-memory attach). One copy, no sockets, no NIXL; a transfer is
// split across a few goroutines so several cores copy at once.
//
// It only serves peers on this host (same boot id and PID namespace) whose
// memory this process may access (same user and a permissive
// kernel.yama.ptrace_scope, or CAP_SYS_PTRACE): AddPeer probes with a
// one-byte read and refuses the peer otherwise, so multipath falls through
// to NIXL or TCP. Like NIXL's, the writes are one-sided: the receiver
// cannot guard them, and a pid is checked against the advertised process
// start time before every transfer so a reused pid is never written.
package cmadata

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/peerkv/peerkv/core/data"
)

// Name is the path's name in logs and in capabilities.
const Name = "cma"

// iovMax is the kernel's IOV_MAX: the most iovecs per process_vm_writev.
const iovMax = 1024

// Options configures the transport.
type Options struct {
	Region data.Region
	// Workers copy one transfer's rows in parallel; 0 = min(4, GOMAXPROCS).
	Workers int
	// TransferTimeout bounds a transfer; a copy still running then fails.
	TransferTimeout time.Duration
}

// Transport is the cross-memory-attach data path of one peer.
type Transport struct {
	opts Options
	me   process

	mu      sync.Mutex
	peers   map[string]*peer
	nextID  uint64
	closed  bool
	running sync.WaitGroup

	outbox *data.Outbox
}

// peer is a registered consumer process and its region.
type peer struct {
	proc    process
	base    uint64
	numRows uint64
	removed bool // set under Transport.mu; running copies stop
}

var _ data.Transport = (*Transport)(nil)

// New prepares the path; it fails on hosts without /proc (not Linux).
func New(opts Options) (*Transport, error) {
	if opts.Region.RowLen == 0 || opts.Region.NumRows() == 0 {
		return nil, errors.New("cmadata: empty region")
	}
	if opts.Workers <= 0 {
		opts.Workers = min(4, runtime.GOMAXPROCS(0))
	}
	if opts.TransferTimeout <= 0 {
		opts.TransferTimeout = 30 * time.Second
	}
	me, err := self()
	if err != nil {
		return nil, fmt.Errorf("cmadata: %w", err)
	}
	return &Transport{opts: opts, me: me, peers: map[string]*peer{}, outbox: data.NewOutbox(1024)}, nil
}

// Name implements data.Transport.
func (t *Transport) Name() string { return Name }

// AgentMetadata implements data.Transport: none.
func (t *Transport) AgentMetadata() []byte { return nil }

// DataAddr implements data.Transport: none.
func (t *Transport) DataAddr() string { return "" }

// LocalProcess is the locator peers need to write into us.
func (t *Transport) LocalProcess() string { return t.me.String() }

// AddPeer registers a consumer on this host, after checking that we may
// access its memory.
func (t *Transport) AddPeer(peerID string, info data.PeerInfo) error {
	proc, err := parseProcess(info.LocalProcess)
	switch {
	case err != nil:
		return fmt.Errorf("cmadata: peer %s: %w", peerID, err)
	case proc.host != t.me.host:
		return fmt.Errorf("cmadata: peer %s runs on another host or PID namespace", peerID)
	case info.RowLen != t.opts.Region.RowLen:
		return fmt.Errorf("cmadata: peer %s row length %d differs from ours %d", peerID, info.RowLen, t.opts.Region.RowLen)
	case info.BaseAddr == 0 || info.NumRows == 0:
		return fmt.Errorf("cmadata: peer %s has an empty region", peerID)
	}
	if err := proc.stillThere(); err != nil {
		return fmt.Errorf("cmadata: peer %s: %w", peerID, err)
	}
	var probe [1]byte
	local := []unix.Iovec{{Base: &probe[0], Len: 1}}
	remote := []unix.RemoteIovec{{Base: uintptr(info.BaseAddr), Len: 1}}
	if _, err := unix.ProcessVMReadv(proc.pid, local, remote, 0); err != nil {
		return fmt.Errorf("cmadata: may not access process %d's memory (%v): needs the same user and "+
			"kernel.yama.ptrace_scope 0, or CAP_SYS_PTRACE", proc.pid, err)
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return data.ErrClosed
	}
	if old := t.peers[peerID]; old != nil {
		old.removed = true
	}
	t.peers[peerID] = &peer{proc: proc, base: info.BaseAddr, numRows: info.NumRows}
	return nil
}

// RemovePeer forgets a peer; its running copies stop and fail.
func (t *Transport) RemovePeer(peerID string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if p := t.peers[peerID]; p != nil {
		p.removed = true
		delete(t.peers, peerID)
	}
}

// Write starts copying local rows src[i] into the peer's rows dst[i].
func (t *Transport) Write(peerID string, src, dst []uint64) (uint64, error) {
	if len(src) != len(dst) {
		return 0, fmt.Errorf("cmadata: %d source rows but %d destination rows", len(src), len(dst))
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return 0, data.ErrClosed
	}
	p := t.peers[peerID]
	if p == nil {
		return 0, fmt.Errorf("%w: %s", data.ErrUnknownPeer, peerID)
	}
	for i := range src {
		if src[i] >= t.opts.Region.NumRows() {
			return 0, fmt.Errorf("%w: local row %d of %d", data.ErrRowOutOfRange, src[i], t.opts.Region.NumRows())
		}
		if dst[i] >= p.numRows {
			return 0, fmt.Errorf("%w: peer row %d of %d", data.ErrRowOutOfRange, dst[i], p.numRows)
		}
	}
	t.nextID++
	id := t.nextID
	t.running.Add(1)
	go func() {
		defer t.running.Done()
		err := t.copyRows(p, src, dst)
		t.outbox.Send(data.Completion{PeerID: peerID, ID: id, Err: err})
	}()
	return id, nil
}

// copyRows splits the rows over the workers and waits for all of them.
func (t *Transport) copyRows(p *peer, src, dst []uint64) error {
	if err := p.proc.stillThere(); err != nil {
		return err
	}
	deadline := time.Now().Add(t.opts.TransferTimeout)
	workers := min(t.opts.Workers, len(src))
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		lo, hi := w*len(src)/workers, (w+1)*len(src)/workers
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[w] = t.copyPart(p, src[lo:hi], dst[lo:hi], deadline)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// copyPart writes rows in batches of up to iovMax rows, merging rows that
// are consecutive on both sides into one iovec.
func (t *Transport) copyPart(p *peer, src, dst []uint64, deadline time.Time) error {
	rowLen := t.opts.Region.RowLen
	mem := t.opts.Region.Mem
	local := make([]unix.Iovec, 0, iovMax)
	remote := make([]unix.RemoteIovec, 0, iovMax)
	for i := 0; i < len(src); {
		if err := t.stillWanted(p, deadline); err != nil {
			return err
		}
		local, remote = local[:0], remote[:0]
		want := 0
		for ; i < len(src) && len(local) < iovMax; i++ {
			n := len(local)
			if n > 0 && src[i] == src[i-1]+1 && dst[i] == dst[i-1]+1 {
				local[n-1].Len += rowLen
				remote[n-1].Len += int(rowLen)
			} else {
				local = append(local, unix.Iovec{Base: &mem[src[i]*rowLen], Len: rowLen})
				remote = append(remote, unix.RemoteIovec{Base: uintptr(p.base + dst[i]*rowLen), Len: int(rowLen)})
			}
			want += int(rowLen)
		}
		got, err := unix.ProcessVMWritev(p.proc.pid, local, remote, 0)
		if err != nil {
			return fmt.Errorf("cmadata: write into process %d: %w", p.proc.pid, err)
		}
		if got != want {
			return fmt.Errorf("cmadata: wrote %d of %d bytes into process %d", got, want, p.proc.pid)
		}
	}
	return nil
}

func (t *Transport) stillWanted(p *peer, deadline time.Time) error {
	t.mu.Lock()
	removed, closed := p.removed, t.closed
	t.mu.Unlock()
	switch {
	case closed:
		return data.ErrClosed
	case removed:
		return errors.New("cmadata: peer removed during the transfer")
	case time.Now().After(deadline):
		return fmt.Errorf("cmadata: transfer still copying after %v", t.opts.TransferTimeout)
	}
	return nil
}

// Completions implements data.Transport.
func (t *Transport) Completions() <-chan data.Completion { return t.outbox.C() }

// Close stops new writes, lets running copies end (each stops at its next
// batch) and closes Completions.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	t.mu.Unlock()
	t.outbox.StartClosing()
	t.running.Wait()
	t.outbox.Finish()
	return nil
}

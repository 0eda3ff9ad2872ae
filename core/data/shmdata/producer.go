package shmdata

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"net"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/peerkv/peerkv/core/data"
)

// maxBatchBytes bounds one copy() call, so a transfer sees Close, removal
// and its deadline between batches.
const maxBatchBytes = 8 << 20

// peer is a consumer whose granted rows we have mapped.
type peer struct {
	id      string
	mapped  []byte // the whole mapping, from the page below the rows
	rows    []byte // the granted rows: the only memory writes touch
	numRows uint64
	users   int         // running transfers; guarded by Transport.mu
	dropped bool        // removed, replaced or closed; guarded by Transport.mu
	gone    atomic.Bool // dropped, as copies see it between batches
}

// AddPeer asks the peer's consumer for its region through the offer in
// info.SameHost and maps the rows granted. info's addresses and row count
// are claims and are ignored.
func (t *Transport) AddPeer(peerID string, info data.PeerInfo) error {
	if info.SameHost == "" {
		return fmt.Errorf("shmdata: peer %s made no same-host offer", peerID)
	}
	o, err := parseOffer(info.SameHost)
	if err != nil {
		return fmt.Errorf("shmdata: peer %s: %w", peerID, err)
	}
	if t.isClosed() {
		return data.ErrClosed
	}
	p, err := t.claim(peerID, o)
	if err != nil {
		return fmt.Errorf("shmdata: peer %s: %w", peerID, err)
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		p.unmap()
		return data.ErrClosed
	}
	old := t.peers[peerID]
	t.peers[peerID] = p
	idle := old != nil && t.dropLocked(old)
	t.mu.Unlock()
	if idle {
		old.unmap()
	}
	return nil
}

// claim runs the grant exchange with the offer's socket and maps the rows.
func (t *Transport) claim(peerID string, o offer) (*peer, error) {
	timeout := t.opts.HandshakeTimeout
	conn, err := (&net.Dialer{Timeout: timeout}).Dial("unix", o.socket)
	if err != nil {
		return nil, fmt.Errorf("%w: no such local socket (another host or network namespace, or the peer is gone): %v",
			data.ErrNotReachable, err)
	}
	c := conn.(*net.UnixConn)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(timeout))
	cred, err := peerCred(c)
	if err != nil {
		return nil, err
	}
	if err := checkCred(cred); err != nil {
		return nil, fmt.Errorf("refusing the offer's socket: %w", err)
	}
	req, err := request{token: o.token, peerID: t.opts.LocalID}.encode()
	if err != nil {
		return nil, err
	}
	if _, err := c.Write(req); err != nil {
		return nil, fmt.Errorf("sending the grant request: %w", err)
	}
	r, fd, err := readReply(c)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd) // the mapping keeps the file
	switch {
	case r.peerID != peerID:
		return nil, fmt.Errorf("the offer's socket belongs to peer %q (process %d), not to %s", r.peerID, cred.Pid, peerID)
	case r.rowLen != t.opts.Region.RowLen:
		return nil, fmt.Errorf("row length %d differs from ours %d", r.rowLen, t.opts.Region.RowLen)
	case r.numRows == 0:
		return nil, errors.New("the peer granted no rows")
	}
	mapped, rows, err := mapRows(fd, r)
	if err != nil {
		return nil, err
	}
	return &peer{id: peerID, mapped: mapped, rows: rows, numRows: r.numRows}, nil
}

// mapRows maps exactly the granted rows of fd's file, writable and shared.
func mapRows(fd int, r reply) (mapped, rows []byte, err error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, nil, fmt.Errorf("fstat of the granted file: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return nil, nil, fmt.Errorf("the granted fd is not a regular file (mode %#o)", st.Mode)
	}
	if err := memoryBacked(fd); err != nil {
		return nil, nil, fmt.Errorf("the granted file: %w", err)
	}
	hi, length := bits.Mul64(r.numRows, r.rowLen)
	end := r.offset + length
	if hi != 0 || end < r.offset || end > uint64(max(st.Size, 0)) {
		return nil, nil, fmt.Errorf("the granted file holds %d bytes, fewer than %d rows of %d at offset %d",
			st.Size, r.numRows, r.rowLen, r.offset)
	}
	page := uint64(unix.Getpagesize())
	start := r.offset &^ (page - 1)
	skip := r.offset - start
	if skip+length > math.MaxInt {
		return nil, nil, errors.New("the granted rows do not fit the address space")
	}
	mapped, err = unix.Mmap(fd, int64(start), int(skip+length), unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("mapping the granted rows: %w", err)
	}
	return mapped, mapped[skip : skip+length], nil
}

// unmap releases the mapping; once, with no copy running and p out of the
// table (callers ensure), and without t.mu: unmapping a large region takes
// a while, and Write, called under the tier's lock, must not wait for it.
func (p *peer) unmap() {
	if p.mapped != nil {
		_ = unix.Munmap(p.mapped)
		p.mapped, p.rows = nil, nil
	}
}

// dropLocked retires p: running copies stop at their next batch and the
// last one out unmaps. It reports whether none is running, in which case
// the caller unmaps p once it has released t.mu. t.mu is held.
func (t *Transport) dropLocked(p *peer) (idle bool) {
	p.dropped = true
	p.gone.Store(true)
	return p.users == 0
}

func (t *Transport) release(p *peer) {
	t.mu.Lock()
	p.users--
	last := p.users == 0 && p.dropped
	t.mu.Unlock()
	if last {
		p.unmap()
	}
}

func (t *Transport) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// RemovePeer forgets a peer; its running copies stop and fail, and its
// mapping goes once the last of them ends.
func (t *Transport) RemovePeer(peerID string) {
	t.mu.Lock()
	p := t.peers[peerID]
	idle := p != nil && t.dropLocked(p)
	delete(t.peers, peerID)
	t.mu.Unlock()
	if idle {
		p.unmap()
	}
}

// Write starts copying local rows src[i] into the peer's rows dst[i].
func (t *Transport) Write(peerID string, src, dst []uint64) (uint64, error) {
	if len(src) != len(dst) {
		return 0, fmt.Errorf("shmdata: %d source rows but %d destination rows", len(src), len(dst))
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
	ours := t.opts.Region.NumRows()
	for i := range src {
		if src[i] >= ours {
			return 0, fmt.Errorf("%w: local row %d of %d", data.ErrRowOutOfRange, src[i], ours)
		}
		if dst[i] >= p.numRows {
			return 0, fmt.Errorf("%w: peer row %d of the %d it granted", data.ErrRowOutOfRange, dst[i], p.numRows)
		}
	}
	src, dst = slices.Clone(src), slices.Clone(dst)
	t.nextID++
	id := t.nextID
	p.users++
	t.running.Add(1)
	go func() {
		defer t.running.Done()
		err := t.copyRows(p, src, dst)
		t.release(p)
		t.outbox.Send(data.Completion{PeerID: peerID, ID: id, Err: err})
	}()
	return id, nil
}

// copyRows splits the rows over the workers and waits for all of them.
func (t *Transport) copyRows(p *peer, src, dst []uint64) error {
	deadline := time.Now().Add(t.opts.TransferTimeout)
	workers := max(1, min(t.opts.Workers, len(src)))
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

// copyPart copies rows in batches, merging rows consecutive on both sides.
// A fault on the mapping (the consumer shrank its file: SIGBUS) becomes
// this transfer's error rather than a crash of the host process.
func (t *Transport) copyPart(p *peer, src, dst []uint64, deadline time.Time) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("shmdata: copy into peer %s faulted (%v): the peer's region file shrank or is unusable", p.id, r)
		}
	}()
	rowLen := t.opts.Region.RowLen
	mem := t.opts.Region.Mem
	maxRun := max(1, maxBatchBytes/rowLen)
	for i := 0; i < len(src); {
		if err := t.stillWanted(p, deadline); err != nil {
			return err
		}
		n := uint64(1)
		for i+int(n) < len(src) && n < maxRun && src[i+int(n)] == src[i]+n && dst[i+int(n)] == dst[i]+n {
			n++
		}
		copy(p.rows[dst[i]*rowLen:(dst[i]+n)*rowLen], mem[src[i]*rowLen:(src[i]+n)*rowLen])
		i += int(n)
	}
	return nil
}

func (t *Transport) stillWanted(p *peer, deadline time.Time) error {
	if t.batchHook != nil {
		t.batchHook()
	}
	switch {
	case t.isClosed():
		return data.ErrClosed
	case p.gone.Load():
		return errors.New("shmdata: peer removed during the transfer")
	case time.Now().After(deadline):
		return fmt.Errorf("shmdata: transfer still copying after %v", t.opts.TransferTimeout)
	}
	return nil
}

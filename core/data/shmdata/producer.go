package shmdata

import (
	"errors"
	"fmt"
	"io"
	"math/bits"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/peerkv/peerkv/core/data"
)

// maxBatchBytes bounds one pwrite, so a transfer sees Close, removal and
// its deadline between batches, and a shrunk file every maxBatchBytes.
const maxBatchBytes = 8 << 20

// peer is a consumer whose region file we were granted.
type peer struct {
	id      string
	fd      int    // write-only, for the granted rows alone; -1 once closed
	base    uint64 // file offset of row 0
	end     uint64 // file offset just past the last granted row
	numRows uint64
	users   int         // running transfers; guarded by Transport.mu
	dropped bool        // removed, replaced or closed; guarded by Transport.mu
	gone    atomic.Bool // dropped, as copies see it between batches
}

// AddPeer asks the peer's consumer for its region through the offer in
// info.SameHost. info.NumRows, the row count the peer's session declared,
// caps the grant; info's addresses are ignored.
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
	p, err := t.claim(peerID, o, info.NumRows)
	if err != nil {
		return fmt.Errorf("shmdata: peer %s: %w", peerID, err)
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		p.closeFile()
		return data.ErrClosed
	}
	old := t.peers[peerID]
	t.peers[peerID] = p
	idle := old != nil && t.dropLocked(old)
	t.mu.Unlock()
	if idle {
		old.closeFile()
	}
	return nil
}

// claim runs the grant exchange with the offer's socket and checks what it
// granted against what the session declared (declaredRows).
func (t *Transport) claim(peerID string, o offer, declaredRows uint64) (*peer, error) {
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
	keep := false
	defer func() {
		if !keep {
			_ = unix.Close(fd)
		}
	}()
	switch {
	case r.peerID != peerID:
		return nil, fmt.Errorf("the offer's socket belongs to peer %q (process %d), not to %s", r.peerID, cred.Pid, peerID)
	case r.rowLen != t.opts.Region.RowLen:
		return nil, fmt.Errorf("row length %d differs from ours %d", r.rowLen, t.opts.Region.RowLen)
	case r.numRows == 0:
		return nil, errors.New("the peer granted no rows")
	case r.numRows > declaredRows:
		return nil, fmt.Errorf("the peer granted %d rows, more than the %d its session declared (num_blocks)",
			r.numRows, declaredRows)
	}
	base, end, err := checkGrantedFile(fd, r)
	if err != nil {
		return nil, err
	}
	keep = true
	return &peer{id: peerID, fd: fd, base: base, end: end, numRows: r.numRows}, nil
}

// checkGrantedFile checks that fd is a writable in-memory file of exactly
// the size the consumer said, holding the granted rows, and returns where
// they start and end in it.
func checkGrantedFile(fd int, r reply) (base, end uint64, err error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, 0, fmt.Errorf("fstat of the granted file: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return 0, 0, fmt.Errorf("the granted fd is not a regular file (mode %#o)", st.Mode)
	}
	if err := memoryBacked(fd); err != nil {
		return 0, 0, fmt.Errorf("the granted file: %w", err)
	}
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return 0, 0, fmt.Errorf("the granted fd's flags: %w", err)
	}
	if mode := flags & unix.O_ACCMODE; mode != unix.O_WRONLY && mode != unix.O_RDWR {
		return 0, 0, errors.New("the granted fd is not open for writing")
	}
	size := uint64(max(st.Size, 0))
	if size != r.fileSize {
		return 0, 0, fmt.Errorf("the granted file holds %d bytes, not the %d the peer said", size, r.fileSize)
	}
	hi, length := bits.Mul64(r.numRows, r.rowLen)
	end = r.offset + length
	if hi != 0 || end < r.offset || end > size {
		return 0, 0, fmt.Errorf("the granted file holds %d bytes, fewer than %d rows of %d at offset %d",
			size, r.numRows, r.rowLen, r.offset)
	}
	return r.offset, end, nil
}

// closeFile releases the granted fd; once, with no copy running and p out
// of the table (callers ensure).
func (p *peer) closeFile() {
	if p.fd >= 0 {
		_ = unix.Close(p.fd)
		p.fd = -1
	}
}

// dropLocked retires p: running copies stop at their next batch and the
// last one out closes its fd. It reports whether none is running, in which
// case the caller closes it once it has released t.mu. t.mu is held.
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
		p.closeFile()
	}
}

func (t *Transport) isClosed() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.closed
}

// RemovePeer forgets a peer; its running copies stop and fail, and its
// fd is closed once the last of them ends.
func (t *Transport) RemovePeer(peerID string) {
	t.mu.Lock()
	p := t.peers[peerID]
	idle := p != nil && t.dropLocked(p)
	delete(t.peers, peerID)
	t.mu.Unlock()
	if idle {
		p.closeFile()
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

// copyPart writes rows in batches, merging rows consecutive on both sides,
// with pwrite(2) on the granted fd: no byte of the peer's file is mapped
// here, so whatever it does to its file, and whatever signal handlers the
// host installed, the copy fails cleanly or succeeds (see the package doc).
func (t *Transport) copyPart(p *peer, src, dst []uint64, deadline time.Time) error {
	rowLen := t.opts.Region.RowLen
	mem := t.opts.Region.Mem
	maxRun := max(1, maxBatchBytes/rowLen)
	// An fstat costs about as much as a small pwrite: the size is checked
	// before the first write, after every maxBatchBytes and after the last.
	var sinceCheck uint64 = maxBatchBytes
	for i := 0; i < len(src); {
		if err := t.stillWanted(p, deadline); err != nil {
			return err
		}
		if sinceCheck >= maxBatchBytes {
			if err := p.checkSize(); err != nil {
				return err
			}
			sinceCheck = 0
		}
		n := uint64(1)
		for i+int(n) < len(src) && n < maxRun && src[i+int(n)] == src[i]+n && dst[i+int(n)] == dst[i]+n {
			n++
		}
		rows := mem[src[i]*rowLen : (src[i]+n)*rowLen]
		if err := pwriteAll(p.fd, rows, p.base+dst[i]*rowLen); err != nil {
			return fmt.Errorf("shmdata: writing rows %d..%d into peer %s: %w", dst[i], dst[i]+n-1, p.id, err)
		}
		i += int(n)
		sinceCheck += n * rowLen
	}
	return p.checkSize() // it may have shrunk under the last writes
}

// checkSize fails the transfer once the peer's file no longer holds every
// granted row: the peer shrank it, and rows written there are lost.
func (p *peer) checkSize() error {
	var st unix.Stat_t
	if err := unix.Fstat(p.fd, &st); err != nil {
		return fmt.Errorf("shmdata: fstat of peer %s's region file: %w", p.id, err)
	}
	if uint64(max(st.Size, 0)) < p.end {
		return fmt.Errorf("shmdata: peer %s's region file shrank to %d bytes, below the %d its grant holds",
			p.id, st.Size, p.end)
	}
	return nil
}

// pwriteAll writes b at off, resuming after short writes and EINTR.
func pwriteAll(fd int, b []byte, off uint64) error {
	for len(b) > 0 {
		n, err := unix.Pwrite(fd, b, int64(off))
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return err
		case n == 0:
			return io.ErrShortWrite
		}
		b, off = b[n:], off+uint64(n)
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

package shmdata

import (
	"errors"
	"fmt"
	"io"
	"math"
	"math/bits"
	"net"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/data/rowsum"
)

// maxBatchBytes bounds one read, so a transfer sees Close, removal and its
// deadline between batches, and a shrunk file every maxBatchBytes.
const maxBatchBytes = 8 << 20

// maxPieces bounds the destination ranges one preadv fills (IOV_MAX is
// 1024): rows consecutive in our file but scattered in the peer's.
const maxPieces = 256

// peer is a consumer whose granted rows we have mapped.
type peer struct {
	id      string
	fd      int    // the granted fd, kept for fstat; -1 once closed
	mapped  []byte // the pages holding the granted rows; nil once unmapped
	rows    []byte // the granted rows in mapped: written by the kernel alone (pread)
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
	end, err := checkGrantedFile(fd, r)
	if err != nil {
		return nil, err
	}
	mapped, rows, err := mapRows(fd, r.offset, end)
	if err != nil {
		return nil, err
	}
	keep = true
	return &peer{id: peerID, fd: fd, mapped: mapped, rows: rows, end: end, numRows: r.numRows}, nil
}

// checkGrantedFile checks that fd is a read-write in-memory file of exactly
// the size the consumer said, holding the granted rows, and returns where
// they end in it.
func checkGrantedFile(fd int, r reply) (end uint64, err error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("fstat of the granted file: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG {
		return 0, fmt.Errorf("the granted fd is not a regular file (mode %#o)", st.Mode)
	}
	if err := memoryBacked(fd); err != nil {
		return 0, fmt.Errorf("the granted file: %w", err)
	}
	flags, err := unix.FcntlInt(uintptr(fd), unix.F_GETFL, 0)
	if err != nil {
		return 0, fmt.Errorf("the granted fd's flags: %w", err)
	}
	if flags&unix.O_ACCMODE != unix.O_RDWR {
		return 0, errors.New("the granted fd is not open for reading and writing (mapping it needs both)")
	}
	size := uint64(max(st.Size, 0))
	if size != r.fileSize {
		return 0, fmt.Errorf("the granted file holds %d bytes, not the %d the peer said", size, r.fileSize)
	}
	hi, length := bits.Mul64(r.numRows, r.rowLen)
	end = r.offset + length
	if hi != 0 || end < r.offset || end > size {
		return 0, fmt.Errorf("the granted file holds %d bytes, fewer than %d rows of %d at offset %d",
			size, r.numRows, r.rowLen, r.offset)
	}
	return end, nil
}

// mapRows maps the pages of fd's file that hold [offset, end), writable and
// shared, and nothing more of it. Go code touches the mapping only while
// Go handles SIGBUS, when a fault there is recovered (copyPartMapped);
// otherwise rows reach it through pread(2), so a fault on it (the file
// shrank) is the kernel's, answered with EFAULT or a short read, never a
// signal (sigbus.go).
func mapRows(fd int, offset, end uint64) (mapped, rows []byte, err error) {
	page := uint64(unix.Getpagesize())
	start := offset &^ (page - 1)
	if end-start > math.MaxInt {
		return nil, nil, errors.New("the granted rows do not fit the address space")
	}
	mapped, err = unix.Mmap(fd, int64(start), int(end-start), unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, nil, fmt.Errorf("mapping the granted rows: %w", err)
	}
	return mapped, mapped[offset-start:], nil
}

// closeFile unmaps the granted rows and closes the granted fd; once, with
// no copy running and p out of the table (callers ensure), and without
// t.mu: unmapping a large region takes a while, and Write, called under the
// tier's lock, must not wait for it.
func (p *peer) closeFile() {
	if p.mapped != nil {
		_ = unix.Munmap(p.mapped)
		p.mapped, p.rows = nil, nil
	}
	if p.fd >= 0 {
		_ = unix.Close(p.fd)
		p.fd = -1
	}
}

// dropLocked retires p: running copies stop at their next batch and the
// last one out unmaps it and closes its fd. It reports whether none is
// running, in which case the caller does so once it has released t.mu.
// t.mu is held.
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
// mapping and fd go once the last of them ends.
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
	return t.write(peerID, src, dst, false)
}

// WriteSummed implements data.Summer: Write, whose copy workers sum each
// source row right after copying it, while it is in the cache; the
// successful completion carries the sums.
func (t *Transport) WriteSummed(peerID string, src, dst []uint64) (uint64, error) {
	return t.write(peerID, src, dst, true)
}

// SetBetweenReads implements data.Summer.
func (t *Transport) SetBetweenReads(f func(peerID string, src []uint64)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.betweenReads = f
}

func (t *Transport) write(peerID string, src, dst []uint64, summed bool) (uint64, error) {
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
	j := &copyJob{peerID: peerID, deadline: time.Now().Add(t.opts.TransferTimeout)}
	if summed {
		j.sums, j.betweenReads = make([]uint64, len(src)), t.betweenReads
	}
	t.copies[id] = j
	p.users++
	t.running.Add(1)
	go func() {
		defer t.running.Done()
		err := t.copyRows(p, src, dst, j)
		t.mu.Lock()
		delete(t.copies, id)
		t.mu.Unlock()
		t.release(p)
		c := data.Completion{PeerID: peerID, ID: id, Err: err}
		if err == nil {
			c.Sums = j.sums
		}
		t.outbox.Send(c)
	}()
	return id, nil
}

// copyJob is one transfer's copy: its deadline, and whether Cancel stopped it.
type copyJob struct {
	peerID   string
	deadline time.Time
	canceled atomic.Bool
	// sums (summed writes) gets each source row's sum, parallel to the
	// write's src; each worker fills its own share.
	sums         []uint64
	betweenReads func(peerID string, src []uint64) // tests: after a batch's copy, before its sums
}

// summedBatchBytes bounds a summed write's batch, so the rows it copied are
// still in the cache when the worker sums them.
const summedBatchBytes = 1 << 20

// maxRun is how many rows one batch copies at most.
func (j *copyJob) maxRun(rowLen uint64) uint64 {
	if j.sums != nil {
		return max(1, summedBatchBytes/rowLen)
	}
	return max(1, maxBatchBytes/rowLen)
}

// summed sums rows src[i:i+n] of region, just copied, into sums[i:i+n]
// (sums is the worker's share of the job's, parallel to src).
func (j *copyJob) summed(region data.Region, src []uint64, sums []uint64, i, n int) {
	if j.sums == nil {
		return
	}
	if j.betweenReads != nil {
		j.betweenReads(j.peerID, src[i:i+n])
	}
	for k := i; k < i+n; k++ {
		sums[k] = rowsum.Row(region.Row(src[k]))
	}
}

// Cancel implements data.Canceler: the copy stops before its next batch
// (at most maxBatchBytes a worker later) and fails with data.ErrCanceled.
func (t *Transport) Cancel(peerID string, id uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if j := t.copies[id]; j != nil && j.peerID == peerID {
		j.canceled.Store(true)
	}
}

// copyRows splits the rows over the workers and waits for all of them. The
// peer's file size is checked once before and once after (an fstat costs
// about as much as a small read), and by each worker every maxBatchBytes.
func (t *Transport) copyRows(p *peer, src, dst []uint64, j *copyJob) error {
	if err := p.checkSize(); err != nil {
		return err
	}
	copyPart := t.copyPart
	if goHandlesSIGBUS() && !t.kernelCopyOnly {
		copyPart = t.copyPartMapped // a fault is recovered: the fast copy is safe (sigbus.go)
	}
	workers := max(1, min(t.opts.Workers, len(src)))
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := range workers {
		lo, hi := w*len(src)/workers, (w+1)*len(src)/workers
		wg.Add(1)
		go func() {
			defer wg.Done()
			var sums []uint64
			if j.sums != nil {
				sums = j.sums[lo:hi]
			}
			errs[w] = copyPart(p, src[lo:hi], dst[lo:hi], sums, j)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return p.checkSize() // it may have shrunk under the last reads
}

// copyPart copies rows in batches with pread(2) from our region's file
// straight into the mapping of the peer's: one preadv for rows consecutive
// in our file, whatever their places in the peer's. Only the kernel touches
// the peer's pages, so whatever the peer does to its file, and whatever
// signal handlers the host installed, the copy fails cleanly or succeeds
// (see the package doc).
func (t *Transport) copyPart(p *peer, src, dst, sums []uint64, j *copyJob) error {
	rowLen := t.opts.Region.RowLen
	maxRun := j.maxRun(rowLen)
	iov := make([]unix.Iovec, 0, min(maxPieces, len(src)))
	var sinceCheck uint64
	for i := 0; i < len(src); {
		if err := t.stillWanted(p, j); err != nil {
			return err
		}
		if sinceCheck >= maxBatchBytes {
			if err := p.checkSize(); err != nil {
				return err
			}
			sinceCheck = 0
		}
		iov = append(iov[:0], p.rowsIovec(dst[i], rowLen))
		n := uint64(1)
		for ; i+int(n) < len(src) && n < maxRun && src[i+int(n)] == src[i]+n; n++ {
			d := dst[i+int(n)]
			if last := &iov[len(iov)-1]; d == dst[i+int(n)-1]+1 {
				last.SetLen(int(last.Len) + int(rowLen))
				continue
			}
			if len(iov) == maxPieces {
				break
			}
			iov = append(iov, p.rowsIovec(d, rowLen))
		}
		if err := preadFull(t.file.fd, iov, t.file.offset+src[i]*rowLen); err != nil {
			return t.copyFailed(p, src[i], n, err)
		}
		j.summed(t.opts.Region, src, sums, i, int(n))
		i += int(n)
		sinceCheck += n * rowLen
	}
	return nil
}

// copyPartMapped copies rows with memcpy into the mapping of the peer's
// rows, merging rows consecutive on both sides; it runs only while Go
// handles SIGBUS (sigbus.go), so a fault on the mapping (the peer shrank
// its file) or on our own becomes this transfer's error, not a crash.
func (t *Transport) copyPartMapped(p *peer, src, dst, sums []uint64, j *copyJob) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = t.copyFailed(p, src[0], uint64(len(src)), fmt.Errorf("the copy faulted: %v", r))
		}
	}()
	rowLen := t.opts.Region.RowLen
	mem := t.opts.Region.Mem
	maxRun := j.maxRun(rowLen)
	// No size check between batches: a shrink faults here, and the fault is
	// this transfer's error (copyRows checks the size once more at the end).
	for i := 0; i < len(src); {
		if err := t.stillWanted(p, j); err != nil {
			return err
		}
		n := uint64(1)
		for i+int(n) < len(src) && n < maxRun && src[i+int(n)] == src[i]+n && dst[i+int(n)] == dst[i]+n {
			n++
		}
		copy(p.rows[dst[i]*rowLen:(dst[i]+n)*rowLen], mem[src[i]*rowLen:(src[i]+n)*rowLen])
		j.summed(t.opts.Region, src, sums, i, int(n))
		i += int(n)
	}
	return nil
}

// copyFailed names why reading rows first..first+n-1 failed: EFAULT or a
// short read mean a file shrank, the peer's (a fault on its pages) or our
// own (end of file); the sizes say which.
func (t *Transport) copyFailed(p *peer, first, n uint64, err error) error {
	if shrank := p.checkSize(); shrank != nil {
		return shrank
	}
	if shrank := t.checkOwnSize(); shrank != nil {
		return shrank
	}
	return fmt.Errorf("shmdata: copying our rows %d..%d into peer %s: %w", first, first+n-1, p.id, err)
}

// checkSize fails the transfer once the peer's file no longer holds every
// granted row: the peer shrank it, and rows copied there are lost.
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

// checkOwnSize fails the transfer once our own region's file no longer
// holds our rows (the host, or a holder of a grant, shrank it).
func (t *Transport) checkOwnSize() error {
	var st unix.Stat_t
	if err := unix.Fstat(t.file.fd, &st); err != nil {
		return fmt.Errorf("shmdata: fstat of our region file: %w", err)
	}
	if end := t.file.offset + uint64(len(t.opts.Region.Mem)); uint64(max(st.Size, 0)) < end {
		return fmt.Errorf("shmdata: our region file shrank to %d bytes, below the %d our rows need", st.Size, end)
	}
	return nil
}

// rowsIovec is the peer's row d in our mapping, as a destination of preadv.
func (p *peer) rowsIovec(d, rowLen uint64) unix.Iovec {
	v := unix.Iovec{Base: &p.rows[d*rowLen]}
	v.SetLen(int(rowLen))
	return v
}

// preadFull fills iov, in order, from fd at off, resuming after short reads
// and EINTR; reading past the end of the file fails. iov is used up.
func preadFull(fd int, iov []unix.Iovec, off uint64) error {
	for len(iov) > 0 {
		n, err := preadv(fd, iov, off)
		switch {
		case errors.Is(err, unix.EINTR):
			continue
		case err != nil:
			return err
		case n == 0:
			return io.ErrUnexpectedEOF
		}
		off += uint64(n)
		for n > 0 {
			if l := int(iov[0].Len); n < l {
				iov[0].Base = (*byte)(unsafe.Add(unsafe.Pointer(iov[0].Base), n))
				iov[0].SetLen(l - n)
				break
			}
			n -= int(iov[0].Len)
			iov = iov[1:]
		}
	}
	return nil
}

// preadv is preadv(2) on iov as it is: x/sys/unix's copies [][]byte into
// a fresh []Iovec on every call.
func preadv(fd int, iov []unix.Iovec, off uint64) (int, error) {
	const half = bits.UintSize / 2 // the offset's high word, 0 on 64-bit
	n, _, errno := unix.Syscall6(unix.SYS_PREADV, uintptr(fd), uintptr(unsafe.Pointer(&iov[0])), uintptr(len(iov)),
		uintptr(off), uintptr(off>>half>>half), 0)
	if errno != 0 {
		return 0, errno
	}
	return int(n), nil
}

func (t *Transport) stillWanted(p *peer, j *copyJob) error {
	if t.batchHook != nil {
		t.batchHook()
	}
	switch {
	case t.isClosed():
		return data.ErrClosed
	case j.canceled.Load():
		return data.ErrCanceled
	case p.gone.Load():
		return errors.New("shmdata: peer removed during the transfer")
	case time.Now().After(j.deadline):
		return fmt.Errorf("shmdata: transfer still copying after %v", t.opts.TransferTimeout)
	}
	return nil
}

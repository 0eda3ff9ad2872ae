package tcpdata

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/data/rowsum"
)

// writeBatchBytes is how much one writev call may carry before the write
// deadline is renewed: the deadline bounds a stall, not a whole transfer.
const writeBatchBytes = 8 << 20

// summedBatchBytes is writeBatchBytes for a summed transfer: small enough
// that the rows writev just read are still in the cache when they are
// summed.
const summedBatchBytes = 1 << 20

// part is a run of a transfer's rows sent on one connection: local rows
// src[first:end] go to the peer's rows dst[first:end]. src and dst are the
// whole transfer's, shared read-only by its parts.
type part struct {
	tr         *transfer
	src, dst   []uint64
	first, end int
}

func (p *part) rows() int { return p.end - p.first }

// peerLink is the producer side of one peer: a queue of transfers, and
// Streams sender goroutines that each own one connection and take the next
// part, sized to their connection's speed, from the transfer at the front.
type peerLink struct {
	t      *Transport
	peerID string
	addr   string
	token  string          // the receiver's grant for this session (data.Grants.DataToken)
	ctx    context.Context // cancelled by shutdown; aborts dials
	cancel context.CancelFunc

	mu     sync.Mutex
	queue  []*transfer           // transfers with rows not yet handed to a sender
	conns  map[net.Conn]struct{} // open connections, closed by shutdown
	closed bool
	wake   chan struct{}
}

func newPeerLink(t *Transport, peerID, addr string) *peerLink {
	ctx, cancel := context.WithCancel(context.Background())
	return &peerLink{
		t: t, peerID: peerID, addr: addr, ctx: ctx, cancel: cancel,
		conns: map[net.Conn]struct{}{},
		wake:  make(chan struct{}, t.opts.Streams),
	}
}

// enqueue hands a transfer's rows to the sender goroutines.
func (l *peerLink) enqueue(tr *transfer) {
	l.mu.Lock()
	if l.closed {
		l.mu.Unlock()
		return // dropLink has failed or will fail the transfer
	}
	l.queue = append(l.queue, tr)
	l.mu.Unlock()
	for range l.t.opts.Streams {
		select {
		case l.wake <- struct{}{}:
		default: // enough wake-ups pending; woken senders drain the queue
		}
	}
}

// pop takes the next part, of about budget bytes (at least one row, enough
// row bytes that the part's header stays small beside them, and no tail
// under minPartBytes left behind), from the transfer at the front; nil when
// the queue is empty.
func (l *peerLink) pop(budget uint64) *part {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.queue) == 0 {
		return nil
	}
	tr := l.queue[0]
	total, rowLen := len(tr.src), l.t.region.RowLen
	budget = max(budget, uint64(indexShare*rowIndexLen*total))
	n := int(min(uint64(total-tr.next), max(1, budget/rowLen)))
	if uint64(total-tr.next-n)*rowLen < minPartBytes {
		n = total - tr.next // no small part left over: it would cost an ack for little
	}
	p := &part{tr: tr, src: tr.src, dst: tr.dst, first: tr.next, end: tr.next + n}
	tr.next += n
	if tr.next == total {
		l.queue[0] = nil
		l.queue = l.queue[1:]
	}
	return p
}

// unqueue drops what is left of tr in the queue (it failed or was canceled).
func (l *peerLink) unqueue(tr *transfer) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if i := slices.Index(l.queue, tr); i >= 0 {
		l.queue = slices.Delete(l.queue, i, i+1)
	}
}

// takeQueue empties the queue and returns the transfers it held.
func (l *peerLink) takeQueue() []*transfer {
	l.mu.Lock()
	defer l.mu.Unlock()
	q := l.queue
	l.queue = nil
	return q
}

// shutdown stops the senders and closes their connections.
func (l *peerLink) shutdown() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return
	}
	l.closed = true
	l.cancel()
	l.queue = nil
	for c := range l.conns {
		_ = c.Close()
	}
}

// track registers a new connection so shutdown can close it; it refuses
// (and closes c) when the link is already shut down.
func (l *peerLink) track(c net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		_ = c.Close()
		return false
	}
	l.conns[c] = struct{}{}
	return true
}

func (l *peerLink) untrack(c net.Conn) {
	l.mu.Lock()
	delete(l.conns, c)
	l.mu.Unlock()
	_ = c.Close()
}

// sender is one stream's state, owned by its goroutine.
type sender struct {
	link   *peerLink
	conn   net.Conn // parts flow here: raw, or TLS over raw
	raw    net.Conn // the tracked TCP connection; closing it ends conn
	header []byte   // part header and indices, reused
	iov    [][]byte // writev vector, reused
	ackBuf [ackLen]byte
	speed  linkSpeed // of conn, sizes its parts

	segmented bool        // the receiver reads segmented parts (featureSegments)
	segRate   segmentRate // of conn, sizes its segments
	prefix    [segHeaderLen]byte
}

// runStream is one sender goroutine: it sends queued parts on its
// connection until the link shuts down.
func (l *peerLink) runStream() {
	s := &sender{link: l}
	defer s.dropConn()
	idle := time.NewTimer(l.t.opts.IdleTimeout)
	defer idle.Stop()
	for {
		if p := l.pop(s.speed.partBytes()); p != nil {
			s.process(p)
			idle.Reset(l.t.opts.IdleTimeout)
			continue
		}
		select {
		case <-l.wake:
		case <-l.ctx.Done():
			return
		case <-idle.C:
			s.dropConn() // the receiver drops it at twice this age
			idle.Reset(l.t.opts.IdleTimeout)
		}
	}
}

// process sends one part and reports its outcome; a panic fails the part
// instead of leaving its transfer pending forever.
func (s *sender) process(p *part) {
	t := s.link.t
	if !t.startPart(p.tr) {
		return // another part failed it, or it was cancelled
	}
	defer func() {
		if r := recover(); r != nil {
			t.opts.Logf("tcpdata: panic sending to %s: %v", s.link.peerID, r)
			s.dropConn()
			t.finishPart(p.tr, 0, fmt.Errorf("%w: panic while sending transfer %d", ErrProtocol, p.tr.id), true)
		}
	}()
	if s.conn == nil {
		if err := s.connect(); err != nil {
			// The peer is unreachable: fail what is queued now rather than
			// let each part wait out its own dial.
			t.finishPart(p.tr, 0, err, true)
			for _, q := range s.link.takeQueue() {
				t.finishPart(q, 0, err, false)
			}
			return
		}
	}
	// A part of a transfer canceled while it waited for this connection is
	// not sent. One already on the wire stops at the end of its segment
	// with a cancel marker (an older receiver: runs to its end, about
	// partDuration); either way the transfer is reported, and its abort
	// acknowledged, only once the receiver acked the part, having read
	// every byte of it sent, so no byte of it can land after the consumer
	// handed its rows back.
	var keepConn bool
	var err error
	if t.canceled(p.tr) {
		keepConn, err = true, data.ErrCanceled
	} else {
		keepConn, err = s.send(p)
	}
	if !keepConn {
		s.dropConn()
	}
	t.finishPart(p.tr, p.rows(), err, true)
}

func (s *sender) dropConn() {
	// Closing the raw connection skips TLS close_notify, which could
	// block on a stalled peer; the receiver reads EOF either way.
	if s.raw != nil {
		s.link.untrack(s.raw)
		s.conn, s.raw = nil, nil
		s.speed, s.segRate = linkSpeed{}, segmentRate{} // a new connection is measured anew
	}
}

// maxHelloDials bounds how often connect dials for one connection.
const maxHelloDials = 8

// connect dials the peer and runs the hello; see doc.go. A connection the
// receiver closes before answering the hello (it made room for a newer one
// while ours had sent nothing yet: doc.go, Admission) is dialled again, at
// most maxHelloDials times and within one IOTimeout in all.
func (s *sender) connect() error {
	deadline := time.Now().Add(s.link.t.opts.IOTimeout)
	for dials := 1; ; dials++ {
		err := s.connectOnce(deadline)
		if err == nil || !closedBeforeAnswer(err) || dials == maxHelloDials || time.Now().After(deadline) {
			return err
		}
	}
}

// closedBeforeAnswer says whether a hello failed because the receiver
// closed the connection without answering, so no byte of a part was sent
// and dialling again is safe.
func closedBeforeAnswer(err error) bool {
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

func (s *sender) connectOnce(deadline time.Time) error {
	l := s.link
	dialer := net.Dialer{Deadline: deadline}
	c, err := dialer.DialContext(l.ctx, "tcp", l.addr)
	if err != nil {
		return fmt.Errorf("tcpdata: dial %s at %s: %w", l.peerID, l.addr, err)
	}
	if !l.track(c) {
		return fmt.Errorf("tcpdata: link to %s shut down", l.peerID)
	}
	l.t.tuneConn(c)
	limitUnsent(c)
	conn, features, err := s.hello(c, deadline)
	if err != nil {
		l.untrack(c)
		return err
	}
	s.conn, s.raw = conn, c
	s.segmented = features&featureSegments != 0
	return nil
}

// hello runs the hello (TLS first in encrypted mode) under deadline and
// returns the connection parts flow on and the receiver's features byte.
func (s *sender) hello(c net.Conn, deadline time.Time) (net.Conn, byte, error) {
	l, opts := s.link, &s.link.t.opts
	_ = c.SetDeadline(deadline)
	var server [serverHelloLen]byte
	if _, err := io.ReadFull(c, server[:]); err != nil {
		return nil, 0, fmt.Errorf("tcpdata: hello from %s at %s: %w", l.peerID, l.addr, err)
	}
	if magic := binary.LittleEndian.Uint32(server[0:]); magic != helloMagic {
		return nil, 0, fmt.Errorf("%w: %s at %s is not a peerkv data port (magic %#x)", ErrProtocol, l.peerID, l.addr, magic)
	}
	h := helloConn{Conn: c}
	ours := uint8(protocolVersion)
	if l.t.tls != nil {
		ours = encryptedVersion
	}
	if v := server[4]; v != ours {
		sendVersionNotice(c, ours)
		return nil, 0, versionError(l.peerID, v, ours)
	}
	if l.t.tls != nil {
		// The clear hello only announced TLS; the real one runs inside.
		var err error
		if h, err = l.t.startClientTLS(c); err != nil {
			return nil, 0, fmt.Errorf("tcpdata: %s at %s: %w", l.peerID, l.addr, err)
		}
		if _, err := io.ReadFull(h, server[:]); err != nil {
			return nil, 0, fmt.Errorf("tcpdata: hello from %s at %s: %w", l.peerID, l.addr, err)
		}
		if magic, v := binary.LittleEndian.Uint32(server[0:]), server[4]; magic != helloMagic || v != encryptedVersion {
			return nil, 0, fmt.Errorf("%w: %s sent hello magic %#x version %d inside TLS", ErrProtocol, l.peerID, magic, v)
		}
	}
	nonce := server[8 : 8+nonceLen]

	id, rowLen := opts.LocalID, l.t.region.RowLen
	key := writerKey(opts.AuthSecret, l.token)
	fixed := h.clientFixedLen()
	msg := make([]byte, fixed+len(id))
	binary.LittleEndian.PutUint32(msg[0:], helloMagic)
	msg[4] = h.version()
	binary.LittleEndian.PutUint16(msg[6:], uint16(len(id)))
	binary.LittleEndian.PutUint64(msg[8:], rowLen)
	var clientNonce []byte
	switch {
	case h.encrypted():
		clientNonce = msg[clientHelloLen:fixed]
		if _, err := rand.Read(clientNonce); err != nil {
			return nil, 0, fmt.Errorf("tcpdata: nonce: %w", err)
		}
		copy(msg[16:], clientMAC(key, nonce, clientNonce, rowLen, h.exporter, id))
	case key != "":
		copy(msg[16:], helloMAC(key, nonce, rowLen, id))
	}
	copy(msg[fixed:], id)
	if _, err := h.Write(msg); err != nil {
		return nil, 0, fmt.Errorf("tcpdata: hello to %s at %s: %w", l.peerID, l.addr, err)
	}
	st, proof, reason, err := h.readStatus()
	if err != nil {
		return nil, 0, fmt.Errorf("tcpdata: hello answer from %s at %s: %w", l.peerID, l.addr, err)
	}
	if st != statusOK {
		return nil, 0, helloError(l.peerID, st, reason)
	}
	// No row goes to a receiver that has not proven the secret too.
	if h.encrypted() && !hmac.Equal(proof, serverMAC(key, clientNonce, nonce, h.exporter, id)) {
		return nil, 0, fmt.Errorf("%w: receiver %s at %s did not prove the shared secret", ErrAuthFailed, l.peerID, l.addr)
	}
	_ = c.SetDeadline(time.Time{})
	return h.Conn, server[6], nil
}

// send writes one part and waits for its ack. keepConn is false when the
// connection is no longer in step and must be dropped.
func (s *sender) send(p *part) (keepConn bool, err error) {
	t, c := s.link.t, s.conn
	rowLen := t.region.RowLen
	need := partHeaderLen + rowIndexLen*len(p.dst)
	if cap(s.header) < need {
		s.header = make([]byte, need)
	}
	hdr := s.header[:need]
	partHeader{
		segmented: s.segmented, partRows: uint32(p.end - p.first), transferID: p.tr.id, rowLen: rowLen,
		totalRows: uint32(len(p.dst)), first: uint32(p.first),
	}.put(hdr)
	for i, row := range p.dst {
		binary.LittleEndian.PutUint64(hdr[partHeaderLen+rowIndexLen*i:], row)
	}

	// Header and rows go out as writev batches straight from the region.
	raceSync()
	start := time.Now()
	limit := writeBatchBytes
	if p.tr.sums != nil {
		limit = summedBatchBytes
	}
	var sent uint64
	var cut bool
	if s.segmented {
		sent, cut, err = s.writeSegments(p, hdr, limit)
	} else {
		sent, err = s.writeRows(p, hdr, limit)
	}
	if err != nil {
		return false, fmt.Errorf("tcpdata: send transfer %d to %s: %w", p.tr.id, s.link.peerID, err)
	}
	written := time.Now()

	_ = c.SetReadDeadline(time.Now().Add(t.opts.IOTimeout))
	if _, err := io.ReadFull(c, s.ackBuf[:]); err != nil {
		return false, fmt.Errorf("tcpdata: ack of transfer %d from %s: %w", p.tr.id, s.link.peerID, err)
	}
	raceSync()
	if !cut { // a cut part's few bytes say nothing of the link's rate
		s.speed.observe(max(sent, 1), start, written, time.Now())
	}
	a := parseAck(s.ackBuf[:])
	if a.transferID != p.tr.id {
		return false, fmt.Errorf("%w: %s acked transfer %d while %d was pending", ErrProtocol, s.link.peerID, a.transferID, p.tr.id)
	}
	if cut && a.status == statusOK {
		return false, fmt.Errorf("%w: %s acked transfer %d whole after its cancel marker", ErrProtocol, s.link.peerID, p.tr.id)
	}
	if !cut && a.status == statusCanceled {
		return false, fmt.Errorf("%w: %s acked transfer %d as cut, which it was not", ErrProtocol, s.link.peerID, p.tr.id)
	}
	// A bad-request answer means the receiver is dropping the connection.
	return a.status != statusBadRequest, partError(s.link.peerID, a.status, a.row)
}

// writeRows writes the part (hdr, then its rows) in writev batches of
// about limit bytes; it returns the row bytes written.
func (s *sender) writeRows(p *part, hdr []byte, limit int) (uint64, error) {
	t := s.link.t
	rowLen := t.region.RowLen
	s.iov = append(s.iov[:0], hdr)
	batchBytes, batchFirst := uint64(len(hdr)), p.first
	for i := p.first; i < p.end; i++ {
		s.iov = append(s.iov, t.region.Row(p.src[i]))
		batchBytes += rowLen
		if batchBytes >= uint64(limit) || i == p.end-1 {
			if err := s.writeBatch(s.conn); err != nil {
				return uint64(i-p.first) * rowLen, err
			}
			s.sumSent(p.tr, batchFirst, i+1)
			s.iov, batchBytes, batchFirst = s.iov[:0], 0, i+1
		}
	}
	return uint64(p.rows()) * rowLen, nil
}

// writeSegments writes a segmented part: hdr, then its rows as segments of
// about segmentDuration at the connection's rate (at most limit bytes), one
// writev each (hdr rides with the first). Before each segment it checks
// the transfer: once canceled (or failed), it writes the cancel marker
// instead, so what the part adds to the link after a cancel is at most one
// segment and the kernel's unsent bytes. It returns the row bytes written
// and whether the part was cut.
func (s *sender) writeSegments(p *part, hdr []byte, limit int) (uint64, bool, error) {
	t := s.link.t
	rowLen := int(t.region.RowLen)
	row, off, summed, sent := p.first, 0, p.first, uint64(0)
	s.iov = append(s.iov[:0], hdr)
	for row < p.end {
		if t.canceled(p.tr) {
			clear(s.prefix[:])
			s.iov = append(s.iov, s.prefix[:])
			err := s.writeBatch(s.conn)
			s.iov = s.iov[:0]
			return sent, true, err
		}
		size := s.segRate.size(limit)
		s.iov = append(s.iov, s.prefix[:])
		n := 0
		for n < size && row < p.end {
			b := t.region.Row(p.src[row])[off:]
			take := min(len(b), size-n)
			s.iov = append(s.iov, b[:take])
			n += take
			if off += take; off == rowLen {
				row, off = row+1, 0
			}
		}
		binary.LittleEndian.PutUint32(s.prefix[:], uint32(n))
		began := time.Now()
		if err := s.writeBatch(s.conn); err != nil {
			return sent, false, err
		}
		s.segRate.observe(n, time.Since(began))
		sent += uint64(n)
		s.sumSent(p.tr, summed, row) // the rows whose last byte went
		summed, s.iov = row, s.iov[:0]
	}
	return sent, false, nil
}

// sumSent sums the source rows tr.src[from:to], which writev has just read
// (sent, or copied into the socket's buffers), when tr is summed: the
// send's read of each row ended before its sum's begins, so a row changed
// in between fails the consumer's check.
func (s *sender) sumSent(tr *transfer, from, to int) {
	if tr.sums == nil {
		return
	}
	if tr.betweenReads != nil {
		tr.betweenReads(s.link.peerID, tr.src[from:to])
	}
	for i := from; i < to; i++ {
		tr.sums[i] = rowsum.Row(s.link.t.region.Row(tr.src[i]))
	}
}

func (s *sender) writeBatch(c net.Conn) error {
	_ = c.SetWriteDeadline(time.Now().Add(s.link.t.opts.IOTimeout))
	bufs := net.Buffers(s.iov)
	_, err := bufs.WriteTo(c)
	clear(s.iov) // drop references to region memory
	return err
}

package tcpdata

import (
	"crypto/hmac"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/peerkv/peerkv/core/data"
)

// acceptBackoff paces the accept loop after a transient error (e.g. EMFILE).
const acceptBackoff = 50 * time.Millisecond

// servePace bounds how long the accept loop waits for a newcomer's hello
// to start before it accepts the next.
const servePace = 20 * time.Millisecond

// acceptLoop accepts writers until the listener closes. It accepts the
// next connection once the last one's hello has started (or servePace has
// passed): under a flood it would otherwise admit connections faster than
// their hellos start, and could only close them unseen to make room.
func (t *Transport) acceptLoop() {
	pace := time.NewTimer(servePace)
	defer pace.Stop()
	for {
		c, err := t.listener.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			t.opts.Logf("tcpdata: accept: %v", err)
			select {
			case <-time.After(acceptBackoff):
				continue
			case <-t.closing:
				return
			}
		}
		t.mu.Lock()
		if t.closed {
			t.mu.Unlock()
			_ = c.Close()
			return
		}
		in := &inboundConn{conn: c, host: remoteHost(c), done: make(chan struct{}), served: make(chan struct{}),
			accepted: time.Now()}
		if !t.admitHello(in) { // may close another connection still in its hello
			t.mu.Unlock()
			_ = c.Close()
			continue
		}
		t.inbound[c] = in
		t.goSafe("receiver "+c.RemoteAddr().String(), func() { t.serveInbound(in) })
		t.mu.Unlock()
		pace.Reset(servePace)
		select {
		case <-in.served:
		case <-in.done:
		case <-pace.C:
		case <-t.closing:
			return
		}
	}
}

// WritesUnguarded implements data.Unguarded: with a guard, every row a
// peer sends is copied in by the guard (receiveRow).
func (t *Transport) WritesUnguarded() bool { return t.opts.Guard == nil }

// Fence implements data.Fencer: it closes every connection writing into us
// for peerID and waits (at most IOTimeout) until their goroutines can
// write no more. A row being copied finishes first; the rest are cut.
func (t *Transport) Fence(peerID string) {
	t.mu.Lock()
	var waits []chan struct{}
	for c, in := range t.inbound {
		if in.peerID == peerID {
			_ = c.Close()
			waits = append(waits, in.done)
		}
	}
	t.mu.Unlock()
	deadline := time.NewTimer(t.opts.IOTimeout)
	defer deadline.Stop()
	for _, done := range waits {
		select {
		case <-done:
		case <-deadline.C:
			t.opts.Logf("tcpdata: fencing %s: a connection did not stop within %v", peerID, t.opts.IOTimeout)
			return
		}
	}
}

// indexChunkRows is how many destination rows are read at a time: a part
// header's row counts allocate nothing before the rows are checked.
const indexChunkRows = 512

// receiver is one inbound connection's state, owned by its goroutine. What
// a part needs in proportion to its rows is taken from the transport's
// byteBudget and given back when the part ends.
type receiver struct {
	t       *Transport
	in      *inboundConn
	conn    net.Conn
	peerID  string
	header  [partHeaderLen]byte
	chunk   [indexChunkRows * rowIndexLen]byte
	refused bool // the guard refused the last row received
	ackBuf  [ackLen]byte
	rowsIn  io.Reader     // the current part's row bytes: conn, or segments
	segs    segmentReader // rowsIn of a segmented part

	// owedNothingSince is when a part was first refused with no row owed
	// to the writer, since the last part it was owed (zero: none since).
	owedNothingSince time.Time
}

// serveInbound runs the hello and then receives parts until the writer
// leaves, a deadline passes or the transport closes. in.conn is the raw
// connection Close shuts; parts flow on the hello's (TLS in encrypted mode).
func (t *Transport) serveInbound(in *inboundConn) {
	c := in.conn
	defer func() {
		t.mu.Lock()
		t.leave(in)
		delete(t.inbound, c)
		t.mu.Unlock()
		_ = c.Close()
		close(in.done)
	}()
	t.tuneConn(c)
	conn, peerID, err := t.acceptHello(in)
	if err != nil {
		t.mu.Lock()
		evicted := in.stage == stageEvicted // counted and logged as such
		t.mu.Unlock()
		if !evicted {
			t.stats.helloFailed.Add(1)
			t.logs.logf("writer refused", "writer at %s: %v", c.RemoteAddr(), err)
		}
		return
	}
	r := &receiver{t: t, in: in, conn: conn, peerID: peerID}
	for {
		if err := r.receivePart(); err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				t.logs.logf("connection dropped", "from %s (%s): %v", peerID, c.RemoteAddr(), err)
			}
			return
		}
	}
}

// acceptHello (TLS first in encrypted mode) challenges the writer and
// returns the connection parts flow on and the writer's peer id. The TLS
// handshake and the hello share one HelloTimeout deadline.
func (t *Transport) acceptHello(in *inboundConn) (net.Conn, string, error) {
	c := in.conn
	_ = c.SetDeadline(time.Now().Add(t.opts.HelloTimeout))
	counted := countingConn{Conn: c, in: in, shape: helloShape{encrypted: t.tls != nil}}
	h := helloConn{Conn: counted}
	if t.tls != nil {
		var err error
		if h, err = t.startServerTLS(counted); err != nil {
			return nil, "", err
		}
	}
	peerID, err := t.helloAsReceiver(h, in)
	if err != nil {
		return nil, "", err
	}
	_ = c.SetDeadline(time.Time{})
	if !h.encrypted() {
		return c, peerID, nil // parts need no counting
	}
	return h.Conn, peerID, nil
}

// admitWriter records who in's hello proved to be and makes it a proven
// writer, or says why it may not write (status ok when it may).
func (t *Transport) admitWriter(in *inboundConn, peerID, token string) (status, string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	in.peerID, in.token = peerID, token
	if token != "" && t.tokens[peerID] != token {
		t.leaveHello(in)
		if in.stage == stageHello {
			in.stage = stageGone
		}
		return statusAuthFailed, fmt.Sprintf("the session of %s ended during the hello", peerID)
	}
	if why := t.promote(in); why != "" {
		if in.stage != stageEvicted {
			t.stats.overConnLimit.Add(1)
		}
		return statusBusy, why
	}
	return statusOK, ""
}

// helloAsReceiver runs the hello and returns the writer's peer id once
// admitWriter let it in.
func (t *Transport) helloAsReceiver(h helloConn, in *inboundConn) (string, error) {
	var server [serverHelloLen]byte
	binary.LittleEndian.PutUint32(server[0:], helloMagic)
	server[4] = h.version()
	if t.opts.AuthSecret != "" || t.opts.RequireGrant {
		server[5] = 1
	}
	if !t.opts.withoutSegments {
		server[6] = featureSegments
	}
	nonce := server[8 : 8+nonceLen]
	if _, err := rand.Read(nonce); err != nil {
		return "", fmt.Errorf("nonce: %w", err)
	}
	if _, err := h.Write(server[:]); err != nil {
		return "", fmt.Errorf("send hello: %w", err)
	}

	client := make([]byte, h.clientFixedLen())
	msg := &helloReader{h: h, in: in, need: len(client)} // marks in mid-hello until the id is read
	if _, err := io.ReadFull(msg, client); err != nil {
		return "", fmt.Errorf("read hello: %w", err)
	}
	refuse := func(st status, reason string) (string, error) {
		_ = h.writeStatus(st, nil, reason)
		return "", fmt.Errorf("%v: %s", st, reason)
	}
	if magic := binary.LittleEndian.Uint32(client[0:]); magic != helloMagic {
		return refuse(statusBadRequest, fmt.Sprintf("hello magic %#x", magic))
	}
	if v := client[4]; v != h.version() {
		if v == encryptedVersion {
			return refuse(statusBadVersion, "the writer's data path is encrypted and ours is not: set encrypt on every peer")
		}
		return refuse(statusBadVersion, fmt.Sprintf("version %d, expected %d", v, h.version()))
	}
	idLen := binary.LittleEndian.Uint16(client[6:])
	if idLen == 0 || idLen > maxPeerIDLen {
		return refuse(statusBadRequest, fmt.Sprintf("peer id of %d bytes", idLen))
	}
	id := make([]byte, idLen)
	msg.need += len(id)
	in.midHello.Store(true)
	if _, err := io.ReadFull(msg, id); err != nil {
		return "", fmt.Errorf("read hello peer id: %w", err)
	}
	peerID := string(id)
	rowLen := binary.LittleEndian.Uint64(client[8:])
	gotMAC := client[16 : 16+macLen]
	t.mu.Lock()
	token := t.tokens[peerID]
	t.mu.Unlock()
	if t.opts.RequireGrant && token == "" {
		return refuse(statusAuthFailed, fmt.Sprintf("no session with %s grants it writes here", peerID))
	}
	key := writerKey(t.opts.AuthSecret, token)
	var clientNonce []byte
	if key != "" {
		var want []byte
		if h.encrypted() {
			clientNonce = client[clientHelloLen : clientHelloLen+nonceLen]
			want = clientMAC(key, nonce, clientNonce, rowLen, h.exporter, peerID)
		} else {
			want = helloMAC(key, nonce, rowLen, peerID)
		}
		if !hmac.Equal(want, gotMAC) {
			what := "the shared secret"
			if token != "" {
				what = "its session's data token"
			}
			return refuse(statusAuthFailed, fmt.Sprintf("%s did not prove %s", peerID, what))
		}
	}
	if rowLen != t.region.RowLen {
		return refuse(statusRowLenMismatch, fmt.Sprintf("%s sends %d-byte rows, ours are %d", peerID, rowLen, t.region.RowLen))
	}
	if st, why := t.admitWriter(in, peerID, token); st != statusOK {
		return refuse(st, why)
	}
	var proof []byte // our proof, only once the writer proved itself
	if h.encrypted() {
		proof = serverMAC(key, clientNonce, nonce, h.exporter, peerID)
	}
	if err := h.writeStatus(statusOK, proof, ""); err != nil {
		return "", fmt.Errorf("answer hello of %s: %w", peerID, err)
	}
	return peerID, nil
}

// helloReader reads a client hello and marks its connection mid-hello
// from its first byte to its need-th, for admission: a writer sends the
// hello whole.
type helloReader struct {
	h         helloConn
	in        *inboundConn
	got, need int
}

func (r *helloReader) Read(b []byte) (int, error) {
	n, err := r.h.Read(b)
	r.got += n
	r.in.midHello.Store(r.got > 0 && r.got < r.need)
	return n, err
}

// idleDeadline is when a receiver stops waiting for the next part: longer
// than the producer's idle close after the last part the writer was owed, so
// only the producer retires a connection that does useful work; parts
// refused as not owed do not renew it. A writer owed nothing that keeps
// sending parts anyway is cut one IOTimeout after the first was refused.
func (r *receiver) idleDeadline() time.Time {
	t := r.t
	d := time.Unix(0, r.in.lastUseful.Load()).Add(2*t.opts.IdleTimeout + t.opts.IOTimeout)
	if !r.owedNothingSince.IsZero() {
		d = minTime(d, r.owedNothingSince.Add(t.opts.IOTimeout))
	}
	return d
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// receivePart reads one part into the region (or discards it when a row is
// refused) and acks it. An error means the connection must be dropped.
// Nothing in proportion to the part's rows is allocated before the writer
// is found to be owed that many rows, and then only within MaxHeldBytes.
func (r *receiver) receivePart() error {
	t, c := r.t, r.conn
	_ = c.SetReadDeadline(r.idleDeadline())
	if _, err := io.ReadFull(c, r.header[:]); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) && !r.owedNothingSince.IsZero() {
			if owedNothing := r.checkOwedNothing(0); owedNothing != nil {
				return owedNothing // counted: the deadline was the one for being owed nothing
			}
		}
		return err
	}
	raceSync()
	h, err := parsePartHeader(r.header[:])
	if err != nil {
		return err
	}
	if !h.valid(t.region.RowLen, t.region.NumRows()) {
		_ = r.writeAck(ack{transferID: h.transferID, status: statusBadRequest})
		return fmt.Errorf("%w: transfer %d header %+v", ErrProtocol, h.transferID, h)
	}
	r.rowsIn = c
	if h.segmented {
		r.segs = segmentReader{conn: c, partLeft: uint64(h.partRows) * h.rowLen}
		r.rowsIn = &r.segs
	}
	if owed, ok := t.rowsOwed(r.peerID); ok && uint64(h.totalRows) > owed {
		t.stats.partsNotOwed.Add(1)
		t.logs.logf("transfer not owed", "transfer %d from %s names %d rows, its loads from us expect %d",
			h.transferID, r.peerID, h.totalRows, owed)
		if err := r.discardPart(h, ack{transferID: h.transferID, status: statusNotOwed, row: owed}); err != nil {
			return err
		}
		return r.checkOwedNothing(owed)
	}
	r.owedNothingSince = time.Time{}
	need := partBytes(h.partRows, t.region.RowLen, t.opts.Guard != nil)
	if !t.held.acquire(need, t.opts.IOTimeout/2, t.closing) {
		t.stats.partsNoRoom.Add(1)
		t.logs.logf("no room for a transfer", "transfer %d from %s: %d bytes for parts in flight are held already (at most %d)",
			h.transferID, r.peerID, t.held.inUse(), t.held.limit)
		return r.discardPart(h, ack{transferID: h.transferID, status: statusBusy})
	}
	defer t.held.release(need)

	rows, verdict, err := r.readDestinations(h)
	if err != nil {
		return err
	}
	if verdict.status == statusOK { // rows it was owed: the connection is in use
		r.in.markUseful(time.Now())
		r.in.inPart.Store(true)
		defer func() { r.in.inPart.Store(false); r.in.markUseful(time.Now()) }()
	}
	if verdict.status != statusOK {
		t.stats.partsRefused.Add(1)
		t.logs.logf("transfer refused", "transfer %d from %s: %v (row %d)", h.transferID, r.peerID, verdict.status, verdict.row)
		if err := r.skipRows(uint64(h.partRows) * h.rowLen); err != nil {
			return fmt.Errorf("transfer %d discarding refused rows: %w", h.transferID, err)
		}
		return r.writeAck(verdict)
	}
	var stage *[]byte // one row, read in full before the guard lets it into the region
	if t.opts.Guard != nil {
		stage = t.stagePool.Get().(*[]byte)
		defer t.stagePool.Put(stage)
	}
	for i, row := range rows {
		if err := r.receiveRow(row, stage); errors.Is(err, errPartCanceled) {
			// Every byte the writer sent before its marker is read: once
			// it reads this ack, nothing more of the part can land.
			return r.writeAck(ack{transferID: h.transferID, status: statusCanceled, row: row})
		} else if err != nil {
			return fmt.Errorf("transfer %d row %d: %w", h.transferID, row, err)
		}
		if r.refused {
			// The load ended while its rows streamed in: drop the rest.
			r.refused = false
			verdict.status, verdict.row = statusRejected, row
			if err := r.skipRows(uint64(len(rows)-i-1) * h.rowLen); err != nil {
				return fmt.Errorf("transfer %d discarding refused rows: %w", h.transferID, err)
			}
			t.logs.logf("row after its load ended", "transfer %d from %s: row %d arrived after its load ended; dropped it and the rest",
				h.transferID, r.peerID, row)
			break
		}
	}
	return r.writeAck(verdict)
}

// checkOwedNothing drops a connection whose writer, owed no row, has kept
// sending parts for an IOTimeout since the first was refused.
func (r *receiver) checkOwedNothing(owed uint64) error {
	if owed > 0 {
		return nil
	}
	now := time.Now()
	if r.owedNothingSince.IsZero() {
		r.owedNothingSince = now
	}
	if now.Sub(r.owedNothingSince) < r.t.opts.IOTimeout {
		return nil
	}
	r.t.stats.owedNothingClosed.Add(1)
	return fmt.Errorf("%w: %s sent parts while owed no row for %v", ErrProtocol, r.peerID, r.t.opts.IOTimeout)
}

// rowsOwed is how many rows peerID's loads from us expect in all, when the
// guard can say.
func (t *Transport) rowsOwed(peerID string) (uint64, bool) {
	if g, ok := t.opts.Guard.(data.OwedRows); ok {
		return uint64(max(g.RowsOwed(peerID), 0)), true
	}
	return 0, false
}

// readDestinations reads the transfer's destination rows a chunk at a time,
// checks each (in range, allowed by the guard) and returns this part's.
// The verdict names the first row refused; the rows are all read anyway so
// the stream stays in step.
func (r *receiver) readDestinations(h partHeader) ([]uint64, ack, error) {
	t := r.t
	verdict := ack{transferID: h.transferID, status: statusOK}
	rows := make([]uint64, 0, h.partRows) // counted in the part's budget
	end := h.first + h.partRows
	for i := uint32(0); i < h.totalRows; {
		n := min(h.totalRows-i, indexChunkRows)
		chunk := r.chunk[:n*rowIndexLen]
		if err := r.readFull(chunk); err != nil {
			return nil, verdict, err
		}
		for j := range n {
			row := binary.LittleEndian.Uint64(chunk[j*rowIndexLen:])
			if i+j >= h.first && i+j < end {
				rows = append(rows, row)
			}
			if verdict.status != statusOK {
				continue
			}
			switch {
			case row >= t.region.NumRows():
				verdict.status, verdict.row = statusRowOutOfRange, row
			case t.opts.Guard != nil && !t.opts.Guard.MayWrite(r.peerID, row):
				verdict.status, verdict.row = statusRejected, row
			}
		}
		i += n
	}
	return rows, verdict, nil
}

// discardPart reads and drops a refused part (destination rows and row
// bytes), then acks it with a.
func (r *receiver) discardPart(h partHeader, a ack) error {
	if err := r.skip(r.conn, uint64(h.totalRows)*rowIndexLen); err != nil {
		return fmt.Errorf("transfer %d discarding refused part: %w", h.transferID, err)
	}
	if err := r.skipRows(uint64(h.partRows) * h.rowLen); err != nil {
		return fmt.Errorf("transfer %d discarding refused part: %w", h.transferID, err)
	}
	return r.writeAck(a)
}

// receiveRow reads one row. With a guard the row is read in full into a
// staging buffer first and the guard copies it in only if its load is still
// running then (r.refused otherwise): a writer that trickles a row cannot
// make it land after the host got the row back.
func (r *receiver) receiveRow(row uint64, stage *[]byte) error {
	dst := r.t.region.Row(row)
	if stage == nil {
		return r.readRow(dst)
	}
	if err := r.readRow(*stage); err != nil {
		return err // a row cut by a cancel marker is not copied in
	}
	r.refused = !r.t.opts.Guard.WriteRow(r.peerID, row, dst, *stage)
	return nil
}

// readFull fills b with a fresh deadline: the deadline bounds a stall.
func (r *receiver) readFull(b []byte) error {
	_ = r.conn.SetReadDeadline(time.Now().Add(r.t.opts.IOTimeout))
	_, err := io.ReadFull(r.conn, b)
	return err
}

// readRow fills b with the part's row bytes, under readFull's deadline.
func (r *receiver) readRow(b []byte) error {
	_ = r.conn.SetReadDeadline(time.Now().Add(r.t.opts.IOTimeout))
	_, err := io.ReadFull(r.rowsIn, b)
	return err
}

// skipRows drops n of the part's row bytes; a cancel marker ends them
// early, and the stream is then in step as well.
func (r *receiver) skipRows(n uint64) error {
	if err := r.skip(r.rowsIn, n); !errors.Is(err, errPartCanceled) {
		return err
	}
	return nil
}

// skip reads and drops n bytes of from so the stream stays in step,
// through io.Discard's small shared buffers; the deadline is renewed per
// chunk.
func (r *receiver) skip(from io.Reader, n uint64) error {
	for n > 0 {
		chunk := min(n, discardChunk)
		_ = r.conn.SetReadDeadline(time.Now().Add(r.t.opts.IOTimeout))
		if _, err := io.CopyN(io.Discard, from, int64(chunk)); err != nil {
			return err
		}
		n -= chunk
	}
	return nil
}

func (r *receiver) writeAck(a ack) error {
	raceSync()
	a.put(r.ackBuf[:])
	_ = r.conn.SetWriteDeadline(time.Now().Add(r.t.opts.IOTimeout))
	_, err := r.conn.Write(r.ackBuf[:])
	return err
}

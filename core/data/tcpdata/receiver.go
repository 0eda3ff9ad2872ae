package tcpdata

import (
	"crypto/hmac"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"time"
)

// acceptBackoff paces the accept loop after a transient error (e.g. EMFILE).
const acceptBackoff = 50 * time.Millisecond

// acceptLoop accepts writers until the listener closes.
func (t *Transport) acceptLoop() {
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
		if why := t.overConnLimit(c); why != "" {
			t.mu.Unlock()
			t.opts.Logf("tcpdata: connection from %s refused: %s", c.RemoteAddr(), why)
			_ = c.Close()
			continue
		}
		t.inbound[c] = &inboundConn{done: make(chan struct{})}
		t.goSafe("receiver "+c.RemoteAddr().String(), func() { t.serveInbound(c) })
		t.mu.Unlock()
	}
}

// overConnLimit says why c may not be served ("" if it may); t.mu held.
func (t *Transport) overConnLimit(c net.Conn) string {
	if len(t.inbound) >= t.opts.MaxConns {
		return fmt.Sprintf("%d data connections already", len(t.inbound))
	}
	host := remoteHost(c)
	n := 0
	for other := range t.inbound {
		if remoteHost(other) == host {
			n++
		}
	}
	if n >= t.opts.MaxConnsPerHost {
		return fmt.Sprintf("%d data connections from %s already", n, host)
	}
	return ""
}

func remoteHost(c net.Conn) string {
	if a, ok := c.RemoteAddr().(*net.TCPAddr); ok {
		return a.IP.String()
	}
	return c.RemoteAddr().String()
}

// inboundConn is what Fence needs of an accepted connection.
type inboundConn struct {
	peerID string        // set under t.mu once its hello named the writer
	token  string        // the data token its hello proved ("" without grants)
	done   chan struct{} // closed when its goroutine can write no more
}

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

// receiver is one inbound connection's state, owned by its goroutine.
type receiver struct {
	t       *Transport
	conn    net.Conn
	peerID  string
	header  [partHeaderLen]byte
	indices []byte
	rows    []uint64
	discard []byte
	stage   []byte // one row, read in full before the guard lets it into the region
	refused bool   // the guard refused the last row received
	ackBuf  [ackLen]byte
}

// serveInbound runs the hello and then receives parts until the writer
// leaves, a deadline passes or the transport closes. c is the raw
// connection Close shuts; parts flow on the hello's (TLS in encrypted mode).
func (t *Transport) serveInbound(c net.Conn) {
	defer func() {
		t.mu.Lock()
		in := t.inbound[c]
		delete(t.inbound, c)
		t.mu.Unlock()
		_ = c.Close()
		if in != nil {
			close(in.done)
		}
	}()
	t.tuneConn(c)
	conn, peerID, token, err := t.acceptHello(c)
	if err != nil {
		t.opts.Logf("tcpdata: writer at %s refused: %v", c.RemoteAddr(), err)
		return
	}
	t.mu.Lock()
	in := t.inbound[c]
	if in != nil {
		in.peerID, in.token = peerID, token
	}
	revoked := token != "" && t.tokens[peerID] != token // its session ended during the hello
	t.mu.Unlock()
	if revoked {
		return
	}
	r := &receiver{t: t, conn: conn, peerID: peerID}
	for {
		if err := r.receivePart(); err != nil {
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
				t.opts.Logf("tcpdata: connection from %s (%s) dropped: %v", peerID, c.RemoteAddr(), err)
			}
			return
		}
	}
}

// acceptHello (TLS first in encrypted mode) challenges the writer and
// returns the connection parts flow on and the writer's peer id. The TLS
// handshake and the hello share one IOTimeout deadline.
func (t *Transport) acceptHello(c net.Conn) (net.Conn, string, string, error) {
	_ = c.SetDeadline(time.Now().Add(t.opts.IOTimeout))
	h := helloConn{Conn: c}
	if t.tls != nil {
		var err error
		if h, err = t.startServerTLS(c); err != nil {
			return nil, "", "", err
		}
	}
	peerID, token, err := t.helloAsReceiver(h)
	if err != nil {
		return nil, "", "", err
	}
	_ = c.SetDeadline(time.Time{})
	return h.Conn, peerID, token, nil
}

// helloAsReceiver runs the hello and returns the writer's peer id and the
// data token it proved ("" when none was granted).
func (t *Transport) helloAsReceiver(h helloConn) (string, string, error) {
	var server [serverHelloLen]byte
	binary.LittleEndian.PutUint32(server[0:], helloMagic)
	server[4] = h.version()
	if t.opts.AuthSecret != "" || t.opts.RequireGrant {
		server[5] = 1
	}
	nonce := server[8 : 8+nonceLen]
	if _, err := rand.Read(nonce); err != nil {
		return "", "", fmt.Errorf("nonce: %w", err)
	}
	if _, err := h.Write(server[:]); err != nil {
		return "", "", fmt.Errorf("send hello: %w", err)
	}

	client := make([]byte, h.clientFixedLen())
	if _, err := io.ReadFull(h, client); err != nil {
		return "", "", fmt.Errorf("read hello: %w", err)
	}
	refuse := func(st status, reason string) (string, string, error) {
		_ = h.writeStatus(st, nil, reason)
		return "", "", fmt.Errorf("%v: %s", st, reason)
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
	if _, err := io.ReadFull(h, id); err != nil {
		return "", "", fmt.Errorf("read hello peer id: %w", err)
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
	var proof []byte // our proof, only once the writer proved itself
	if h.encrypted() {
		proof = serverMAC(key, clientNonce, nonce, h.exporter, peerID)
	}
	if err := h.writeStatus(statusOK, proof, ""); err != nil {
		return "", "", fmt.Errorf("answer hello of %s: %w", peerID, err)
	}
	return peerID, token, nil
}

// idleDeadline is how long a receiver waits for the next part: longer than
// the producer's idle close, so only the producer retires a connection.
func (t *Transport) idleDeadline() time.Time {
	return time.Now().Add(2*t.opts.IdleTimeout + t.opts.IOTimeout)
}

// receivePart reads one part into the region (or discards it when a row is
// refused) and acks it. An error means the connection must be dropped.
func (r *receiver) receivePart() error {
	t, c := r.t, r.conn
	_ = c.SetReadDeadline(t.idleDeadline())
	if _, err := io.ReadFull(c, r.header[:]); err != nil {
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

	total := int(h.totalRows)
	if cap(r.indices) < total*rowIndexLen {
		r.indices = make([]byte, total*rowIndexLen)
		r.rows = make([]uint64, total)
	}
	indices, rows := r.indices[:total*rowIndexLen], r.rows[:total]
	if err := r.readFull(indices); err != nil {
		return err
	}
	verdict := ack{transferID: h.transferID, status: statusOK}
	for i := range rows {
		row := binary.LittleEndian.Uint64(indices[i*rowIndexLen:])
		rows[i] = row
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
	rows = rows[h.first : h.first+h.partRows]

	if verdict.status == statusOK {
		for i, row := range rows {
			if err := r.receiveRow(row); err != nil {
				return fmt.Errorf("transfer %d row %d: %w", h.transferID, row, err)
			}
			if r.refused {
				// The load ended while its rows streamed in: drop the rest.
				r.refused = false
				verdict.status, verdict.row = statusRejected, row
				if err := r.skip(uint64(len(rows)-i-1) * h.rowLen); err != nil {
					return fmt.Errorf("transfer %d discarding refused rows: %w", h.transferID, err)
				}
				t.opts.Logf("tcpdata: transfer %d from %s: row %d arrived after its load ended; dropped it and the rest",
					h.transferID, r.peerID, row)
				break
			}
		}
	} else {
		t.opts.Logf("tcpdata: refused transfer %d from %s: %v (row %d)", h.transferID, r.peerID, verdict.status, verdict.row)
		if err := r.skip(uint64(h.partRows) * h.rowLen); err != nil {
			return fmt.Errorf("transfer %d discarding refused rows: %w", h.transferID, err)
		}
	}
	return r.writeAck(verdict)
}

// receiveRow reads one row. With a guard the row is read in full into a
// staging buffer first and the guard copies it in only if its load is still
// running then (r.refused otherwise): a writer that trickles a row cannot
// make it land after the host got the row back.
func (r *receiver) receiveRow(row uint64) error {
	dst := r.t.region.Row(row)
	if r.t.opts.Guard == nil {
		return r.readFull(dst)
	}
	if r.stage == nil {
		r.stage = make([]byte, len(dst))
	}
	if err := r.readFull(r.stage); err != nil {
		return err
	}
	r.refused = !r.t.opts.Guard.WriteRow(r.peerID, row, dst, r.stage)
	return nil
}

// readFull fills b with a fresh deadline: the deadline bounds a stall.
func (r *receiver) readFull(b []byte) error {
	_ = r.conn.SetReadDeadline(time.Now().Add(r.t.opts.IOTimeout))
	_, err := io.ReadFull(r.conn, b)
	return err
}

// skip reads and drops n bytes so the stream stays in step.
func (r *receiver) skip(n uint64) error {
	if r.discard == nil {
		r.discard = make([]byte, discardBufferSize)
	}
	for n > 0 {
		chunk := r.discard[:min(n, uint64(len(r.discard)))]
		if err := r.readFull(chunk); err != nil {
			return err
		}
		n -= uint64(len(chunk))
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

package tcpdata

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"

	"github.com/peerkv/peerkv/core/data"
)

// Wire constants; see doc.go for the layout.
const (
	helloMagic      = 0x44564b50 // "PKVD" little-endian
	partMagic       = 0x50564b50 // "PKVP" little-endian
	segPartMagic    = 0x53564b50 // "PKVS": a part whose row bytes come in segments
	protocolVersion = 1

	nonceLen        = 32
	macLen          = sha256.Size
	serverHelloLen  = 8 + nonceLen
	clientHelloLen  = 16 + macLen
	helloStatusLen  = 4
	partHeaderLen   = 32
	ackLen          = 24
	maxPeerIDLen    = 1024
	maxStatusMsgLen = 1024
	maxTransferRows = 1 << 20
	macContext      = "peerkv/tcpdata/v1"
	rowIndexLen     = 8
	discardChunk    = 1 << 20 // bytes skipped per read deadline

	// featureSegments, in the server hello's features byte, says the
	// receiver reads segmented parts (segPartMagic): a producer may then
	// end a part early with a cancel marker. An older receiver sends 0
	// there (padding) and gets plain parts.
	featureSegments = 1 << 0
	// segHeaderLen is a segment's length prefix; a length of 0 is the
	// cancel marker: the writer sends nothing more of the part.
	segHeaderLen = 4
)

// status is a receiver's answer to a hello or a part.
type status uint8

const (
	statusOK status = iota
	statusRejected
	statusRowOutOfRange
	statusBadRequest
	statusAuthFailed
	statusRowLenMismatch
	statusBadVersion
	statusNotOwed  // the transfer names more rows than the writer's loads expect; row: how many they do
	statusBusy     // no room now: too many connections, or bytes held for parts
	statusCanceled // the writer ended the part early with a cancel marker; every byte before it was read
)

func (s status) String() string {
	switch s {
	case statusOK:
		return "ok"
	case statusRejected:
		return "rejected by the guard"
	case statusRowOutOfRange:
		return "row out of range"
	case statusBadRequest:
		return "bad request"
	case statusAuthFailed:
		return "authentication failed"
	case statusRowLenMismatch:
		return "row length mismatch"
	case statusBadVersion:
		return "unsupported protocol version"
	case statusNotOwed:
		return "more rows than the writer's loads expect"
	case statusBusy:
		return "receiver busy"
	case statusCanceled:
		return "part canceled by its writer"
	}
	return fmt.Sprintf("status %d", uint8(s))
}

// ErrAuthFailed is returned when the receiver refused the producer's proof
// of the shared secret (or required one the producer did not have).
var ErrAuthFailed = errors.New("tcpdata: authentication failed")

// ErrHandshake is returned when the receiver refused a connection for any
// other reason (row length, version).
var ErrHandshake = errors.New("tcpdata: handshake refused")

// ErrBusy is returned when the receiver had no room for a connection or a
// part: it holds as many as its bounds allow (MaxConns, MaxHeldBytes).
var ErrBusy = errors.New("tcpdata: receiver busy")

// ErrProtocol is returned for a malformed or unexpected frame.
var ErrProtocol = errors.New("tcpdata: protocol error")

// valid says whether the header is consistent with a region of numRows rows
// of rowLen bytes: a transfer names at most every row once, so no header
// makes us allocate more than the region's row count of indices.
func (h partHeader) valid(rowLen, numRows uint64) bool {
	return h.rowLen == rowLen && h.partRows > 0 && h.totalRows <= maxTransferRows && uint64(h.totalRows) <= numRows &&
		uint64(h.first)+uint64(h.partRows) <= uint64(h.totalRows)
}

// partError maps a part's ack status to the error its transfer reports.
func partError(peerID string, st status, row uint64) error {
	switch st {
	case statusOK:
		return nil
	case statusRejected:
		return fmt.Errorf("%w: %s refused row %d", data.ErrRejected, peerID, row)
	case statusRowOutOfRange:
		return fmt.Errorf("%w: row %d is outside %s's region", data.ErrRowOutOfRange, row, peerID)
	case statusNotOwed:
		return fmt.Errorf("%w: %s expects only %d rows from us in all", data.ErrRejected, peerID, row)
	case statusBusy:
		return fmt.Errorf("%w: %s had no room for the transfer", ErrBusy, peerID)
	case statusCanceled:
		return fmt.Errorf("%w: %s read the part up to its cancel marker", data.ErrCanceled, peerID)
	}
	return fmt.Errorf("%w: %s answered %v", ErrProtocol, peerID, st)
}

// helloError maps a hello status and the receiver's reason to an error.
func helloError(peerID string, st status, reason string) error {
	switch st {
	case statusAuthFailed:
		return fmt.Errorf("%w: %s: %s", ErrAuthFailed, peerID, reason)
	case statusBusy:
		return fmt.Errorf("%w: %s: %s", ErrBusy, peerID, reason)
	}
	return fmt.Errorf("%w by %s: %v: %s", ErrHandshake, peerID, st, reason)
}

// helloMAC is the writer's proof of the secret for one connection.
func helloMAC(secret string, nonce []byte, rowLen uint64, peerID string) []byte {
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte(macContext))
	m.Write(nonce)
	var rl [8]byte
	binary.LittleEndian.PutUint64(rl[:], rowLen)
	m.Write(rl[:])
	m.Write([]byte(peerID))
	return m.Sum(nil)
}

// partHeader is the fixed part of a part frame. A part carries the
// destination rows of the whole transfer, so the receiver can refuse the
// transfer before any part writes, and the bytes of rows
// [first, first+partRows) of that list; segmented, those bytes come as
// length-prefixed segments that a cancel marker may end early.
type partHeader struct {
	segmented  bool
	partRows   uint32
	transferID uint64
	rowLen     uint64
	totalRows  uint32
	first      uint32
}

func (h partHeader) put(b []byte) {
	magic := uint32(partMagic)
	if h.segmented {
		magic = segPartMagic
	}
	binary.LittleEndian.PutUint32(b[0:], magic)
	binary.LittleEndian.PutUint32(b[4:], h.partRows)
	binary.LittleEndian.PutUint64(b[8:], h.transferID)
	binary.LittleEndian.PutUint64(b[16:], h.rowLen)
	binary.LittleEndian.PutUint32(b[24:], h.totalRows)
	binary.LittleEndian.PutUint32(b[28:], h.first)
}

func parsePartHeader(b []byte) (partHeader, error) {
	magic := binary.LittleEndian.Uint32(b[0:])
	if magic != partMagic && magic != segPartMagic {
		return partHeader{}, fmt.Errorf("%w: part magic %#x", ErrProtocol, magic)
	}
	return partHeader{
		segmented:  magic == segPartMagic,
		partRows:   binary.LittleEndian.Uint32(b[4:]),
		transferID: binary.LittleEndian.Uint64(b[8:]),
		rowLen:     binary.LittleEndian.Uint64(b[16:]),
		totalRows:  binary.LittleEndian.Uint32(b[24:]),
		first:      binary.LittleEndian.Uint32(b[28:]),
	}, nil
}

// ack is the receiver's answer to one part.
type ack struct {
	transferID uint64
	status     status
	row        uint64 // the offending row when status is not ok
}

func (a ack) put(b []byte) {
	clear(b[:ackLen])
	binary.LittleEndian.PutUint64(b[0:], a.transferID)
	b[8] = byte(a.status)
	binary.LittleEndian.PutUint64(b[16:], a.row)
}

func parseAck(b []byte) ack {
	return ack{
		transferID: binary.LittleEndian.Uint64(b[0:]),
		status:     status(b[8]),
		row:        binary.LittleEndian.Uint64(b[16:]),
	}
}

// writeStatus sends a hello answer; reason is cut to the wire limit. In
// encrypted mode the answer carries mac (zeros when nil).
func (h helloConn) writeStatus(st status, mac []byte, reason string) error {
	if len(reason) > maxStatusMsgLen {
		reason = reason[:maxStatusMsgLen]
	}
	fixed := helloStatusLen
	if h.encrypted() {
		fixed += macLen
	}
	b := make([]byte, fixed+len(reason))
	b[0] = byte(st)
	binary.LittleEndian.PutUint16(b[2:], uint16(len(reason)))
	copy(b[helloStatusLen:fixed], mac)
	copy(b[fixed:], reason)
	_, err := h.Write(b)
	return err
}

// readStatus reads a hello answer; mac is nil in plaintext mode.
func (h helloConn) readStatus() (st status, mac []byte, reason string, err error) {
	fixed := helloStatusLen
	if h.encrypted() {
		fixed += macLen
	}
	b := make([]byte, fixed)
	if _, err := io.ReadFull(h, b); err != nil {
		return 0, nil, "", err
	}
	n := binary.LittleEndian.Uint16(b[2:])
	if n > maxStatusMsgLen {
		return 0, nil, "", fmt.Errorf("%w: hello status reason of %d bytes", ErrProtocol, n)
	}
	msg := make([]byte, n)
	if _, err := io.ReadFull(h, msg); err != nil {
		return 0, nil, "", err
	}
	if h.encrypted() {
		mac = b[helloStatusLen:]
	}
	return status(b[0]), mac, string(msg), nil
}

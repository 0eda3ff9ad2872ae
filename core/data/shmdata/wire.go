package shmdata

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"

	"golang.org/x/sys/unix"
)

// The grant exchange on the local socket, all sizes bounded:
//
//	request: version(1) token(16) idLen(1) id(idLen)
//	granted: statusGranted(1) idLen(1) id(idLen) rowLen(8) numRows(8) offset(8) fileSize(8),
//	         a read-write fd for the region's file, opened for this grant, in SCM_RIGHTS
//	refused: statusRefused(1) reasonLen(1) reason(reasonLen)
//
// Version 2 added fileSize and made tokens single-use.
const (
	wireVersion   byte = 2
	statusGranted byte = 0
	statusRefused byte = 1
	maxIDLen           = 255
	maxReplyLen        = 2 + maxIDLen + 32
)

type request struct {
	token  token
	peerID string // the requester's own id
}

func (r request) encode() ([]byte, error) {
	if len(r.peerID) == 0 || len(r.peerID) > maxIDLen {
		return nil, fmt.Errorf("peer id of %d bytes (1..%d allowed)", len(r.peerID), maxIDLen)
	}
	b := append([]byte{wireVersion}, r.token[:]...)
	b = append(b, byte(len(r.peerID)))
	return append(b, r.peerID...), nil
}

func readRequest(r io.Reader) (request, error) {
	var head [1 + tokenLen + 1]byte
	if _, err := io.ReadFull(r, head[:]); err != nil {
		return request{}, err
	}
	if head[0] != wireVersion {
		return request{}, fmt.Errorf("protocol version %d, want %d", head[0], wireVersion)
	}
	var req request
	copy(req.token[:], head[1:1+tokenLen])
	n := int(head[1+tokenLen])
	if n == 0 {
		return request{}, errors.New("empty peer id")
	}
	id := make([]byte, n)
	if _, err := io.ReadFull(r, id); err != nil {
		return request{}, err
	}
	req.peerID = string(id)
	return req, nil
}

// reply is what the consumer granted.
type reply struct {
	peerID  string // the consumer's own id
	rowLen  uint64
	numRows uint64
	offset  uint64 // of the region in the file
	// fileSize is the file's size as the consumer saw it when granting;
	// the producer's fstat of the fd it got must agree.
	fileSize uint64
}

func (r reply) encode() []byte {
	b := []byte{statusGranted, byte(len(r.peerID))}
	b = append(b, r.peerID...)
	b = binary.BigEndian.AppendUint64(b, r.rowLen)
	b = binary.BigEndian.AppendUint64(b, r.numRows)
	b = binary.BigEndian.AppendUint64(b, r.offset)
	return binary.BigEndian.AppendUint64(b, r.fileSize)
}

func encodeRefusal(reason string) []byte {
	if len(reason) > maxIDLen {
		reason = reason[:maxIDLen]
	}
	return append([]byte{statusRefused, byte(len(reason))}, reason...)
}

// errShort means more bytes are needed to decode a reply.
var errShort = errors.New("short reply")

// errRefusedByPeer carries the consumer's stated reason.
type errRefusedByPeer struct{ reason string }

func (e errRefusedByPeer) Error() string {
	return fmt.Sprintf("the peer refused the grant: %q", e.reason)
}

func decodeReply(b []byte) (reply, error) {
	if len(b) < 2 {
		return reply{}, errShort
	}
	n := int(b[1])
	switch b[0] {
	case statusRefused:
		if len(b) < 2+n {
			return reply{}, errShort
		}
		return reply{}, errRefusedByPeer{reason: string(b[2 : 2+n])}
	case statusGranted:
		if len(b) < 2+n+32 {
			return reply{}, errShort
		}
		rest := b[2+n:]
		return reply{
			peerID:   string(b[2 : 2+n]),
			rowLen:   binary.BigEndian.Uint64(rest),
			numRows:  binary.BigEndian.Uint64(rest[8:]),
			offset:   binary.BigEndian.Uint64(rest[16:]),
			fileSize: binary.BigEndian.Uint64(rest[24:]),
		}, nil
	}
	return reply{}, fmt.Errorf("unknown reply status %d", b[0])
}

// readReply reads one reply and the fd that came with it (-1 if none).
// The caller's deadline on c bounds every read.
func readReply(c *net.UnixConn) (reply, int, error) {
	buf := make([]byte, maxReplyLen)
	oob := make([]byte, unix.CmsgSpace(4*4)) // room to see (and close) a few stray fds
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return reply{}, -1, err
	}
	fds, ferr := parseRights(oob[:oobn])
	fd := -1
	if len(fds) > 0 {
		fd = fds[0]
	}
	closeExtra := func() {
		for _, f := range fds[min(1, len(fds)):] {
			_ = unix.Close(f)
		}
	}
	fail := func(err error) (reply, int, error) {
		closeExtra()
		if fd >= 0 {
			_ = unix.Close(fd)
		}
		return reply{}, -1, err
	}
	switch {
	case ferr != nil:
		return fail(ferr)
	case flags&unix.MSG_CTRUNC != 0:
		return fail(errors.New("the reply's control data was truncated"))
	case len(fds) > 1:
		return fail(fmt.Errorf("the reply carried %d file descriptors, want 1", len(fds)))
	}
	for {
		r, err := decodeReply(buf[:n])
		if !errors.Is(err, errShort) {
			if err != nil {
				return fail(err)
			}
			if fd < 0 {
				return fail(errors.New("the grant came without a file descriptor"))
			}
			return r, fd, nil
		}
		if n == len(buf) {
			return fail(errors.New("reply too long"))
		}
		m, err := c.Read(buf[n:])
		if err != nil {
			return fail(fmt.Errorf("reading the reply: %w", err))
		}
		n += m
	}
}

func parseRights(oob []byte) ([]int, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("control data: %w", err)
	}
	var fds []int
	for i := range msgs {
		got, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			continue // not SCM_RIGHTS
		}
		fds = append(fds, got...)
	}
	return fds, nil
}

// peerCred is the kernel's record of who is at the other end of c: the
// connecting process for an accepted conn, the listening one for a dialled.
func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var credErr error
	if err := raw.Control(func(fd uintptr) {
		cred, credErr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return nil, err
	}
	if credErr != nil {
		return nil, fmt.Errorf("SO_PEERCRED: %w", credErr)
	}
	return cred, nil
}

// checkCred refuses a process of another user and our own process.
func checkCred(cred *unix.Ucred) error {
	switch {
	case int(cred.Uid) != os.Geteuid():
		return fmt.Errorf("process %d runs as uid %d, we as %d", cred.Pid, cred.Uid, os.Geteuid())
	case int(cred.Pid) == os.Getpid():
		return errors.New("the socket's other end is this very process")
	}
	return nil
}

package shmdata

import (
	"errors"
	"fmt"
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// maxServing bounds the grant exchanges served at once; more are closed.
const maxServing = 16

// serve accepts grant requests until the listener closes.
func (t *Transport) serve() {
	defer t.serving.Done()
	slots := make(chan struct{}, maxServing)
	for {
		c, err := t.ln.AcceptUnix()
		if err != nil {
			if !errors.Is(err, net.ErrClosed) {
				t.logf("shmdata: accept: %v", err)
				time.Sleep(50 * time.Millisecond) // e.g. out of fds: do not spin
				continue
			}
			return
		}
		select {
		case slots <- struct{}{}:
		default:
			t.logf("shmdata: refused a grant request: %d already being served", maxServing)
			_ = c.Close()
			continue
		}
		if !t.track(c) {
			_ = c.Close()
			<-slots
			return
		}
		t.serving.Add(1)
		go func() {
			defer t.serving.Done()
			defer func() { <-slots }()
			defer t.untrack(c)
			t.serveOne(c)
		}()
	}
}

// track records c so Close can cut it short; false once closed.
func (t *Transport) track(c *net.UnixConn) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.conns[c] = struct{}{}
	return true
}

func (t *Transport) untrack(c *net.UnixConn) {
	t.mu.Lock()
	delete(t.conns, c)
	t.mu.Unlock()
	_ = c.Close()
}

// serveOne hands the region's fd to a same-user process of another pid
// that presents the token we issued to the id it claims.
func (t *Transport) serveOne(c *net.UnixConn) {
	defer func() {
		if r := recover(); r != nil {
			t.logf("shmdata: panic serving a grant request: %v", r)
		}
	}()
	_ = c.SetDeadline(time.Now().Add(t.opts.HandshakeTimeout))
	cred, err := peerCred(c)
	if err == nil {
		err = checkCred(cred)
	}
	if err != nil {
		t.logf("shmdata: refused a grant request: %v", err)
		_, _ = c.Write(encodeRefusal("credentials refused"))
		return
	}
	req, err := readRequest(c)
	if err != nil {
		t.logf("shmdata: refused a grant request from process %d: bad request: %v", cred.Pid, err)
		_, _ = c.Write(encodeRefusal("bad request"))
		return
	}
	if err := t.grants.use(req.peerID, req.token); err != nil {
		why := "no such live grant (wrong, expired or withdrawn token, or issued to another peer)"
		if errors.Is(err, errGrantUsed) {
			why = "its token was already used (a token grants once: a replay, or a second claim of one offer)"
		}
		t.logf("shmdata: refused a grant request from process %d claiming peer %q: %s", cred.Pid, req.peerID, why)
		_, _ = c.Write(encodeRefusal(err.Error()))
		return
	}
	fd, size, err := t.grantFd()
	if err != nil {
		t.logf("shmdata: no grant for peer %q (process %d): %v", req.peerID, cred.Pid, err)
		_, _ = c.Write(encodeRefusal("region file unavailable"))
		return
	}
	defer unix.Close(fd)
	r := reply{peerID: t.opts.LocalID, rowLen: t.opts.Region.RowLen, numRows: t.opts.Region.NumRows(),
		offset: t.file.offset, fileSize: size}
	if t.replyHook != nil {
		t.replyHook(&r)
	}
	t.granted.Store(true) // before the peer can hold the fd
	if _, _, err := c.WriteMsgUnix(r.encode(), unix.UnixRights(fd), nil); err != nil {
		t.logf("shmdata: sending the grant to peer %q (process %d): %v", req.peerID, cred.Pid, err)
	}
}

// grantFd opens our region's file anew, read-write, for one grant, and
// returns its size. Read-write because the producer maps the granted rows
// and a mapping needs read access; a fresh open file description so that
// what the claimant does to its flags is not ours.
func (t *Transport) grantFd() (fd int, size uint64, err error) {
	fd, err = unix.Open(fmt.Sprintf("/proc/self/fd/%d", t.file.fd), unix.O_RDWR|unix.O_CLOEXEC|unix.O_NOCTTY|unix.O_NONBLOCK, 0)
	if err != nil {
		return -1, 0, fmt.Errorf("reopening the region's file: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		_ = unix.Close(fd)
		return -1, 0, fmt.Errorf("fstat of the region's file: %w", err)
	}
	return fd, uint64(max(st.Size, 0)), nil
}

// Package shmdata is the same-host data path: the producer maps the granted
// rows of the consumer's region file and copies its own rows into that
// mapping, split across a few goroutines: with memcpy while Go handles
// SIGBUS, else with pread(2) (sigbus.go). One copy, no sockets on the data
// path, no NIXL.
//
// Access is granted by the kernel, never by the wire. The consumer (whose
// region receives rows) keeps an fd for the file behind its region (vLLM's
// is on /dev/shm; anonymous memory cannot be served) and listens on a Unix
// socket in the abstract namespace under an unguessable name. Offer mints a
// random single-use token bound to one peer id; the offer string (socket +
// token) goes to that peer in our connect. The peer's producer dials the
// socket, both ends read SO_PEERCRED and refuse another user or their own
// process, the producer presents the token with its own id, and only if
// that is the unused token issued to exactly that id does the consumer
// reply with its own id, row length, row count and file size and pass a
// read-write fd for the file (opened for that grant; a mapping needs read
// access) over SCM_RIGHTS. The producer checks the replier is the peer it
// meant, that it grants no more rows than its session declared and that
// the file is as large as it says, maps only the pages holding the granted
// rows and writes nowhere else.
//
// Why two copies: the consumer (or any holder of a writable fd) may shrink
// its file at any time, and a store into a mapped page past the new end
// raises SIGBUS in whoever stores. Go turns that into a panic the copy
// recovers only while its own handler is installed, so that is checked at
// each transfer. Where a host installed another one after us (Python's
// faulthandler, which vLLM's watchdog enables once the engine runs, when
// its dump_dir is set) the fault would end the process, so the kernel
// copies instead: pread from our region's file into the mapping, where a
// fault on the peer's pages comes back as EFAULT or a short read, and
// reading past the end of our own shrunk file as a short read, never a
// signal. Either way the transfer fails naming the file that shrank. The
// kernel's copy is slower (tmpfs copies page by page: about half of memcpy
// per thread); pwrite(2) would serialise the workers on tmpfs's inode lock,
// reads take none.
//
// Addresses and row counts a peer advertises in connect are claims: only
// the grant sizes the writes, and it may not exceed the session's claim.
package shmdata

import (
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/peerkv/peerkv/core/data"
)

// Name is the path's name in logs and in capabilities.
const Name = "shm"

// Options configures the transport.
type Options struct {
	// Region is the host's region; it must be a MAP_SHARED mapping of a
	// file (a memfd or a file on /dev/shm) to be granted to peers.
	Region data.Region
	// LocalID is this node's id ("host:port"); it binds tokens and
	// replies, so a grant reaches only the peer it was issued to.
	LocalID string
	// Workers copy one transfer's rows in parallel; 0 = min(4, GOMAXPROCS).
	Workers int
	// TransferTimeout bounds a transfer; a copy still running then fails.
	TransferTimeout time.Duration
	// HandshakeTimeout bounds the grant exchange: dialling and every read
	// and write on the local socket (0 = 3s).
	HandshakeTimeout time.Duration
	// GrantTTL is how long an offer stays valid (0 = 5 minutes).
	GrantTTL time.Duration
	// Logf receives refusals and other diagnostics (nil = silent).
	Logf func(format string, args ...any)
}

// Transport is the same-host data path of one peer: it grants its region to
// peers (consumer side) and writes into peers' regions (producer side).
type Transport struct {
	opts   Options
	file   regionFile
	ln     *net.UnixListener
	grants *grants

	mu      sync.Mutex
	peers   map[string]*peer
	copies  map[uint64]*copyJob // transfers running, for Cancel
	conns   map[*net.UnixConn]struct{}
	nextID  uint64
	closed  bool
	running sync.WaitGroup // transfers
	serving sync.WaitGroup // the acceptor and its exchanges

	outbox    *data.Outbox
	closeOnce sync.Once
	// granted: a peer was sent our region's fd; from then on it can write
	// into any of our rows around the guard, for good.
	granted atomic.Bool

	// betweenReads, when set (tests), runs in summed writes after each
	// batch's copy and before its sums (SetBetweenReads).
	betweenReads func(peerID string, src []uint64)
	// batchHook, when set (tests), runs before each batch a copy starts.
	batchHook func()
	// kernelCopyOnly (tests) makes every transfer take the kernel's copy,
	// whoever handles SIGBUS.
	kernelCopyOnly bool
	// replyHook, when set (tests), alters each grant before it is sent.
	replyHook func(*reply)
}

var (
	_ data.Transport = (*Transport)(nil)
	_ data.Granter   = (*Transport)(nil)
	_ data.Canceler  = (*Transport)(nil)
	_ data.Unguarded = (*Transport)(nil)
	_ data.Summer    = (*Transport)(nil)
)

// New finds the file behind opts.Region and starts the grant listener. It
// fails, saying why, when the region cannot be granted (anonymous or
// private memory, no fd for its file).
func New(opts Options) (*Transport, error) {
	switch {
	case opts.Region.RowLen == 0 || opts.Region.NumRows() == 0:
		return nil, errors.New("shmdata: empty region")
	case opts.LocalID == "" || len(opts.LocalID) > maxIDLen:
		return nil, fmt.Errorf("shmdata: local id of %d bytes (1..%d allowed)", len(opts.LocalID), maxIDLen)
	}
	if opts.Workers <= 0 {
		opts.Workers = min(4, runtime.GOMAXPROCS(0))
	}
	if opts.TransferTimeout <= 0 {
		opts.TransferTimeout = 30 * time.Second
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = 3 * time.Second
	}
	if opts.GrantTTL <= 0 {
		opts.GrantTTL = defaultGrantTTL
	}
	file, err := findRegionFile(opts.Region.Mem)
	if err != nil {
		return nil, fmt.Errorf("shmdata: %w", err)
	}
	sealSize(file.fd)
	name, err := randomHex(socketRandLen)
	if err != nil {
		_ = unix.Close(file.fd)
		return nil, fmt.Errorf("shmdata: socket name: %w", err)
	}
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: socketPrefix + name, Net: "unix"})
	if err != nil {
		_ = unix.Close(file.fd)
		return nil, fmt.Errorf("shmdata: listen: %w", err)
	}
	t := &Transport{
		opts:   opts,
		file:   file,
		ln:     ln,
		grants: newGrants(opts.GrantTTL),
		peers:  map[string]*peer{},
		copies: map[uint64]*copyJob{},
		conns:  map[*net.UnixConn]struct{}{},
		outbox: data.NewOutbox(1024),
	}
	t.serving.Add(1)
	go t.serve()
	return t, nil
}

// Name implements data.Transport.
func (t *Transport) Name() string { return Name }

// AgentMetadata implements data.Transport: none.
func (t *Transport) AgentMetadata() []byte { return nil }

// DataAddr implements data.Transport: none.
func (t *Transport) DataAddr() string { return "" }

// Grant implements data.Granter: g.SameHost is a fresh offer to peerID.
func (t *Transport) Grant(peerID string, g *data.Grants) { g.SameHost = t.Offer(peerID) }

// Revoke implements data.Granter.
func (t *Transport) Revoke(peerID string, g data.Grants) { t.Withdraw(peerID, g.SameHost) }

// Offer is a fresh grant of our region to peerID ("" when none can be made).
func (t *Transport) Offer(peerID string) string {
	t.mu.Lock()
	closed := t.closed
	t.mu.Unlock()
	if closed || peerID == "" || len(peerID) > maxIDLen {
		return ""
	}
	tok, err := t.grants.issue(peerID)
	if err != nil {
		t.logf("shmdata: no offer for %s: %v", peerID, err)
		return ""
	}
	return offer{socket: t.ln.Addr().String(), token: tok}.String()
}

// Withdraw revokes an offer made to peerID if it is still its current one.
func (t *Transport) Withdraw(peerID, offerString string) {
	o, err := parseOffer(offerString)
	if err != nil || o.socket != t.ln.Addr().String() {
		return
	}
	t.grants.revoke(peerID, o.token)
}

// WritesUnguarded implements data.Unguarded: once a peer was sent our
// region's fd, it can write any of our rows whenever it likes.
func (t *Transport) WritesUnguarded() bool { return t.granted.Load() }

// Completions implements data.Transport.
func (t *Transport) Completions() <-chan data.Completion { return t.outbox.C() }

// Close stops granting, fails running transfers at their next batch, waits
// for them, closes every peer's granted fd and closes Completions.
func (t *Transport) Close() error {
	t.closeOnce.Do(func() {
		t.mu.Lock()
		t.closed = true
		for c := range t.conns {
			_ = c.Close()
		}
		var idle []*peer
		for id, p := range t.peers {
			if t.dropLocked(p) {
				idle = append(idle, p)
			}
			delete(t.peers, id)
		}
		t.mu.Unlock()
		for _, p := range idle {
			p.closeFile()
		}
		_ = t.ln.Close()
		t.serving.Wait()
		t.outbox.StartClosing()
		t.running.Wait()
		_ = unix.Close(t.file.fd)
		t.outbox.Finish()
	})
	return nil
}

// sealSize fixes the size of a memfd region that allows sealing, so no
// holder of a grant (nor the host by mistake) can shrink or grow it; other
// files (vLLM's on /dev/shm) take no seals and are left as they are.
func sealSize(fd int) {
	_, _ = unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW)
}

func (t *Transport) logf(format string, args ...any) {
	if t.opts.Logf != nil {
		t.opts.Logf(format, args...)
	}
}

// Package data defines the data path: the producer writes whole rows of its
// primary CPU region into rows of the consumer's region.
//
// Contract for every implementation:
//   - Write never blocks on the network: it starts a transfer and returns its
//     id; the outcome arrives exactly once on Completions.
//   - Transfer ids are unique for the transport's lifetime.
//   - A transfer reported done has written every row; one reported failed may
//     have written some rows, and none outside the rows it was given.
//   - Close is idempotent; transfers still running complete as failed.
package data

import (
	"errors"
	"unsafe"
)

// Region is the host's primary CPU region: NumRows rows of RowLen bytes.
// The host owns the memory; peerkv never frees it.
type Region struct {
	Mem    []byte // len(Mem) == NumRows*RowLen
	RowLen uint64
}

// NumRows is the number of rows in the region.
func (r Region) NumRows() uint64 {
	if r.RowLen == 0 {
		return 0
	}
	return uint64(len(r.Mem)) / r.RowLen
}

// Row returns row i of the region.
func (r Region) Row(i uint64) []byte { return r.Mem[i*r.RowLen : (i+1)*r.RowLen] }

// PeerInfo is what a peer advertised about its data path in connect.
type PeerInfo struct {
	AgentMetadata []byte // NIXL agent metadata, opaque
	BaseAddr      uint64
	NumRows       uint64
	RowLen        uint64
	DataAddr      string // TCP data listener, from peerkv capabilities
	// Grants are what the peer granted us, for us alone (see Granter).
	Grants
}

// Grants are what one side hands one peer, for that peer alone and for one
// session, so the peer's paths may reach it and write into it. Each path
// fills its own field; empty fields are paths that grant nothing.
type Grants struct {
	// SameHost is the same-host path's offer: the local socket to claim
	// our region's fd from, and the token that claim must present. The
	// grant the kernel then checks (SO_PEERCRED, the region's fd over
	// SCM_RIGHTS) is what allows writes, never an address from the wire.
	SameHost string
	// DataToken keys the MAC the peer's TCP data connections must prove:
	// only the session's own peer can write into us over TCP, and its
	// connections end with the session.
	DataToken string
}

// Granter is implemented by paths that grant peers access one session at a
// time: Grant fills this path's field of g for peerID (replacing what it
// granted that peer before), Revoke withdraws it when the session ends (if
// it is still the current grant).
type Granter interface {
	Grant(peerID string, g *Grants)
	Revoke(peerID string, g Grants)
}

// Completion is the outcome of one transfer.
type Completion struct {
	PeerID string
	ID     uint64
	Err    error // nil when every row was written
	// Sums is the XXH3-64 of each source row as it was read for the send,
	// parallel to the Write's src, for writes that asked for them
	// (rowsum.Writer.WriteSummed); nil otherwise.
	Sums []uint64
}

// WriteGuard tells a receiving transport whether peerID may write a row.
// Transports that receive writes themselves (TCP) must consult it for every
// row; one-sided transports (NIXL) cannot.
type WriteGuard interface {
	// MayWrite says whether peerID may write row now (to refuse a transfer
	// before any of its rows is read).
	MayWrite(peerID string, row uint64) bool
	// WriteRow copies src into dst, row's bytes in our region, if peerID
	// may write row, atomically with the check: the owner cannot release a
	// load's rows while one of them is being copied, so a row that arrives
	// late never lands after the host got the rows back.
	WriteRow(peerID string, row uint64, dst, src []byte) bool
}

// OwedRows is implemented by WriteGuards that know how many rows peerID may
// write now in all (the rows of its loads in flight). A receiving transport
// refuses a transfer naming more destination rows than that before it
// allocates anything in proportion to them.
type OwedRows interface {
	RowsOwed(peerID string) int
}

// Fencer is implemented by paths that receive writes themselves (TCP, and
// memdata in tests). Fence cuts every write into us from peerID that is
// under way: when it returns, nothing that peer sent before can still land.
// The owner fences a peer before it hands back the rows of a load that peer
// never confirmed ended (no transfer_done or abort_ack), so a late write of
// that load cannot land in rows the host gave a newer load from the same
// peer. One-sided paths (NIXL, shm) cannot be fenced; see docs/security.md.
type Fencer interface {
	Fence(peerID string)
}

// Canceler is implemented by paths that can stop a transfer they queued.
// Cancel drops the parts of transfer id to peerID not yet sent; a part
// under way stops where the receiver can confirm it (tcpdata: at the end
// of a segment of about 5 ms of its link) or finishes. The transfer then
// completes once, failed
// with ErrCanceled, when nothing more of it will be written (or as it
// would have, had it already finished). Unknown ids are ignored. Cancel
// never blocks on the network.
type Canceler interface {
	Cancel(peerID string, id uint64)
}

// GuardFunc is a WriteGuard from a predicate, for tests and for receivers
// whose owner never releases rows concurrently.
type GuardFunc func(peerID string, row uint64) bool

// MayWrite implements WriteGuard.
func (f GuardFunc) MayWrite(peerID string, row uint64) bool { return f(peerID, row) }

// WriteRow implements WriteGuard (check, then copy: not atomic).
func (f GuardFunc) WriteRow(peerID string, row uint64, dst, src []byte) bool {
	if !f(peerID, row) {
		return false
	}
	copy(dst, src)
	return true
}

// Transport is the data path of one peer.
type Transport interface {
	// Name is the transport's wire name: "tcp" or "nixl".
	Name() string
	// AgentMetadata is sent in connect.agent_metadata.
	AgentMetadata() []byte
	// DataAddr is the TCP data listener advertised to peerkv peers ("" if none).
	DataAddr() string
	// AddPeer registers a remote peer from its connect. It may be slow (NIXL
	// loads metadata) and is never called on a host thread.
	AddPeer(peerID string, info PeerInfo) error
	// RemovePeer forgets a peer; its running transfers fail.
	RemovePeer(peerID string)
	// Write copies local rows src[i] to the peer's rows dst[i].
	Write(peerID string, src, dst []uint64) (uint64, error)
	// Completions delivers each transfer's outcome once.
	Completions() <-chan Completion
	// Close stops the transport.
	Close() error
}

// ErrUnknownPeer is returned when writing to a peer that was not added.
var ErrUnknownPeer = errors.New("data transport: unknown peer")

// ErrRowOutOfRange is returned for a row index outside a region.
var ErrRowOutOfRange = errors.New("data transport: row out of range")

// ErrRejected is reported when the receiver refused a write (guard).
var ErrRejected = errors.New("data transport: receiver rejected the write")

// ErrNotReachable is returned by AddPeer when the path cannot reach that
// peer from here at all (say, a same-host path and a peer on another host):
// an expected miss, not a fault worth warning about.
var ErrNotReachable = errors.New("data transport: peer not reachable on this path")

// ErrCanceled is reported for a transfer stopped by Cancel.
var ErrCanceled = errors.New("data transport: transfer canceled")

// ErrClosed is returned by calls on a closed transport.
var ErrClosed = errors.New("data transport closed")

// BaseAddr is the address of the region's first byte, as advertised in
// connect.base_addr (0 for an empty region).
func (r Region) BaseAddr() uint64 {
	if len(r.Mem) == 0 {
		return 0
	}
	return uint64(uintptr(unsafe.Pointer(&r.Mem[0])))
}

// Unguarded is implemented by paths that know whether a peer may have
// written into our region without the WriteGuard: one-sided paths once a
// peer could reach the region (a same-host grant claimed, NIXL). The owner
// then checks a verified load's rows by reading them again, since what the
// guard saw of the writes says nothing about such writes. A path that does
// not implement it is taken to allow unguarded writes.
type Unguarded interface {
	WritesUnguarded() bool
}

// Summer is implemented by paths that take a summed write's source sums
// themselves, each row's right after the path read the whole row for the
// send, while it is in the cache, instead of in a pass of their caller's
// before the send. The send's read of a row ends before its sum's begins,
// so a row changed while its transfer ran fails the consumer's check, as
// with a sum taken first.
type Summer interface {
	// WriteSummed is Write whose successful completion carries Sums; it
	// returns ErrNotSummed when the path serving peerID cannot sum.
	WriteSummed(peerID string, src, dst []uint64) (uint64, error)
	// SetBetweenReads makes every later summed write call f after the
	// send read rows src and before they are summed (tests change a
	// source row there).
	SetBetweenReads(f func(peerID string, src []uint64))
}

// ErrNotSummed is returned by Summer.WriteSummed when the path serving the
// peer does not sum its writes: the caller sums them itself.
var ErrNotSummed = errors.New("data transport: this path does not sum writes")

package nixl

/*
#include "capi.h"
*/
import "C"

import (
	"crypto/rand"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/peerkv/peerkv/core/data"
)

// DefaultUCXEngineConfig keeps UCX off GPU lanes (rc_gda) for host-memory
// transfers, as vLLM's NixlTransport does; UCX_* environment variables win.
const DefaultUCXEngineConfig = "TLS=^rc_gda"

// DefaultProgressDelay is the progress thread's poll timeout: idle, the
// thread wakes 100 times a second (well under 1 % of a core) instead of
// spinning; traffic wakes it at once.
const DefaultProgressDelay = 10 * time.Millisecond

// Options configure a NIXL transport.
type Options struct {
	Region  data.Region // the host's primary region, registered once as DRAM
	LibPath string      // libnixl_capi.so; "" = FindLibrary
	// SearchPrefixes are Python prefixes FindLibrary searches first.
	SearchPrefixes []string

	AgentName       string   // "" = a random UUID (like vLLM)
	Backends        []string // nil = ["UCX"]
	NumThreads      int      // UCX num_threads; 0 = 4 (vLLM's default), <0 = NIXL's default
	UCXEngineConfig string   // UCX engine_config; "" = DefaultUCXEngineConfig, "-" = none
	// NoProgressThread turns NIXL's progress thread off (Python nixl and
	// vLLM keep it on). Our own writes still progress (status polls drive
	// them), but nothing progresses the UCX worker for peers writing into
	// us (wire-up, transports that need the target, such as tcp), so this
	// is for tests only.
	NoProgressThread bool
	// ProgressDelay is how long NIXL's progress thread sleeps in poll() on
	// the UCX workers' event fds between passes (NIXL's pthr_delay_us; it
	// rounds up to whole milliseconds). Traffic for a worker wakes it at
	// once; the delay only bounds a wake-up UCX fails to signal. 0 =
	// DefaultProgressDelay; < 0 = NIXL's default 0, which makes the thread
	// poll without sleeping: a whole core, even with no peer (Python nixl
	// and vLLM run it so).
	ProgressDelay time.Duration

	InitTimeout     time.Duration // agent creation, registration and descriptor prep; 0 = 30s
	CallTimeout     time.Duration // wait for the owner goroutine to take a call; 0 = 10s
	TransferTimeout time.Duration // a transfer not done by then fails; 0 = 30s
	CloseTimeout    time.Duration // Close's wait for NIXL teardown, and for a reader of the last completions; 0 = 10s
}

func (o *Options) fillDefaults() {
	if len(o.Backends) == 0 {
		o.Backends = []string{"UCX"}
	}
	if o.NumThreads == 0 {
		o.NumThreads = 4
	}
	if o.UCXEngineConfig == "" {
		o.UCXEngineConfig = DefaultUCXEngineConfig
	}
	if o.AgentName == "" {
		o.AgentName = newUUID()
	}
	if o.ProgressDelay == 0 {
		o.ProgressDelay = DefaultProgressDelay
	}
	if o.InitTimeout <= 0 {
		o.InitTimeout = 30 * time.Second
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = 10 * time.Second
	}
	if o.TransferTimeout <= 0 {
		o.TransferTimeout = 30 * time.Second
	}
	if o.CloseTimeout <= 0 {
		o.CloseTimeout = 10 * time.Second
	}
}

// agentConfig is the agent's progress-thread configuration.
func (o *Options) agentConfig() agentConfig {
	cfg := agentConfig{progressThread: !o.NoProgressThread}
	if o.ProgressDelay > 0 {
		cfg.progressDelayUs = max(1, uint64(o.ProgressDelay.Microseconds())) // 0 would spin
	}
	return cfg
}

func (o *Options) backendParams(backend string) map[string]string {
	params := map[string]string{}
	if backend != "UCX" {
		return params
	}
	if o.NumThreads > 0 {
		params["num_threads"] = fmt.Sprint(o.NumThreads)
	}
	if o.UCXEngineConfig != "-" {
		params["engine_config"] = o.UCXEngineConfig
	}
	return params
}

// ErrOwnerBusy is returned when the owner goroutine did not take a call
// within CallTimeout (a NIXL call is stuck); the call was not made.
var ErrOwnerBusy = errors.New("nixl transport: owner goroutine busy, call not made")

// ErrTransferTimeout fails a transfer still running after TransferTimeout.
var ErrTransferTimeout = errors.New("nixl transport: transfer timed out")

// ErrPeerRemoved fails the running transfers of a removed peer.
var ErrPeerRemoved = errors.New("nixl transport: peer removed")

// Transport is the NIXL data path. All NIXL calls run on one owner goroutine
// locked to its OS thread: NIXL agents are not thread-safe.
type Transport struct {
	opts     Options
	libPath  string
	metadata []byte
	baseAddr uint64
	numRows  uint64

	calls       chan *call
	posts       postQueue // writes for the owner to post (see Write)
	stop        chan struct{}
	stopOnce    sync.Once
	ownerDone   chan struct{}
	closeErr    error
	teardownErr error // written by the owner before ownerDone closes
	nextID      atomic.Uint64
	completions *completionQueue

	// Owned by the owner goroutine.
	agent    *agent
	local    C.nixl_dlist_handle
	peers    map[string]*peer
	inflight map[uint64]*transfer
	stuck    []C.nixl_xfer_req // requests whose release failed; retried
}

type peer struct {
	nixlName string
	dlist    C.nixl_dlist_handle
	gen      uint64 // its registration in posts, which holds its row count
}

type transfer struct {
	peerID   string
	req      C.nixl_xfer_req
	deadline time.Time
}

var (
	_ data.Transport = (*Transport)(nil)
	_ data.Canceler  = (*Transport)(nil)
)

// New loads NIXL, creates an agent with its backends, registers the region
// and prepares its per-row descriptors.
func New(opts Options) (*Transport, error) {
	opts.fillDefaults()
	if opts.Region.RowLen == 0 || opts.Region.NumRows() == 0 {
		return nil, errors.New("nixl transport: empty region")
	}
	if uint64(len(opts.Region.Mem))%opts.Region.RowLen != 0 {
		return nil, fmt.Errorf("nixl transport: region of %d bytes is not a whole number of %d-byte rows", len(opts.Region.Mem), opts.Region.RowLen)
	}
	if opts.Region.NumRows() > math.MaxInt32 {
		return nil, fmt.Errorf("nixl transport: %d rows exceed NIXL's int indices", opts.Region.NumRows())
	}
	libPath, err := Load(opts.LibPath, opts.SearchPrefixes...)
	if err != nil {
		return nil, err
	}
	t := &Transport{
		opts:      opts,
		libPath:   libPath,
		baseAddr:  uint64(uintptr(unsafe.Pointer(&opts.Region.Mem[0]))),
		numRows:   opts.Region.NumRows(),
		calls:     make(chan *call),
		posts:     newPostQueue(),
		stop:      make(chan struct{}),
		ownerDone: make(chan struct{}),
		peers:     map[string]*peer{},
		inflight:  map[uint64]*transfer{},
	}
	t.completions = newCompletionQueue(opts.CloseTimeout)
	started := make(chan error, 1)
	go t.run(started)
	select {
	case err := <-started:
		if err != nil {
			return nil, err
		}
		return t, nil
	case <-time.After(opts.InitTimeout):
		// The owner tears the agent down as soon as init returns.
		t.stopOnce.Do(func() { close(t.stop) })
		return nil, fmt.Errorf("nixl transport: agent setup still running after %v", opts.InitTimeout)
	}
}

// Name is the transport's wire name.
func (t *Transport) Name() string { return "nixl" }

// AgentMetadata is this agent's NIXL metadata blob.
func (t *Transport) AgentMetadata() []byte { return append([]byte(nil), t.metadata...) }

// AgentName is this agent's NIXL name.
func (t *Transport) AgentName() string { return t.opts.AgentName }

// LibPath is the libnixl_capi.so in use.
func (t *Transport) LibPath() string { return t.libPath }

// DataAddr is empty: NIXL needs no peerkv data listener.
func (t *Transport) DataAddr() string { return "" }

// BaseAddr is the region's address, advertised to peers in connect.
func (t *Transport) BaseAddr() uint64 { return t.baseAddr }

// Completions delivers each transfer's outcome once; closed after Close.
func (t *Transport) Completions() <-chan data.Completion { return t.completions.out }

// AddPeer loads the peer's metadata and prepares its per-row descriptors.
func (t *Transport) AddPeer(peerID string, info data.PeerInfo) error {
	switch {
	case len(info.AgentMetadata) == 0:
		return fmt.Errorf("nixl transport: peer %s sent no agent metadata", peerID)
	case info.BaseAddr == 0 || info.NumRows == 0:
		return fmt.Errorf("nixl transport: peer %s has an empty region (base %#x, %d rows)", peerID, info.BaseAddr, info.NumRows)
	case info.RowLen != t.opts.Region.RowLen:
		return fmt.Errorf("nixl transport: peer %s row length %d differs from ours %d", peerID, info.RowLen, t.opts.Region.RowLen)
	case info.NumRows > math.MaxInt32:
		return fmt.Errorf("nixl transport: peer %s has %d rows, beyond NIXL's int indices", peerID, info.NumRows)
	}
	var err error
	if callErr := t.do(func() { err = t.addPeer(peerID, info) }); callErr != nil {
		return callErr
	}
	return err
}

// RemovePeer forgets a peer; its running transfers fail with ErrPeerRemoved.
func (t *Transport) RemovePeer(peerID string) {
	_ = t.do(func() { t.removePeer(peerID, ErrPeerRemoved) })
}

// Write posts one WRITE of local rows src[i] into the peer's rows dst[i].
// It checks the rows and queues the post for the owner goroutine without
// waiting for it: callers hold the tier's lock, and the owner may be busy
// for a while adding a peer (loading its metadata). A write that is not
// posted (its peer was removed or re-added meanwhile, it waited longer than
// CallTimeout, NIXL refused it) is reported failed as its completion.
func (t *Transport) Write(peerID string, src, dst []uint64) (uint64, error) {
	if len(src) != len(dst) {
		return 0, fmt.Errorf("nixl transport: %d source rows but %d destination rows", len(src), len(dst))
	}
	if len(src) == 0 {
		return 0, errors.New("nixl transport: write of no rows")
	}
	select {
	case <-t.stop:
		return 0, data.ErrClosed
	default:
	}
	srcIdx := make([]C.int, len(src))
	for i, row := range src {
		if row >= t.numRows {
			return 0, fmt.Errorf("%w: local row %d of %d", data.ErrRowOutOfRange, row, t.numRows)
		}
		srcIdx[i] = C.int(row)
	}
	reg, ok := t.posts.registered(peerID)
	if !ok {
		return 0, fmt.Errorf("%w: %s", data.ErrUnknownPeer, peerID)
	}
	dstIdx := make([]C.int, len(dst))
	for i, row := range dst {
		if row >= reg.numRows {
			return 0, fmt.Errorf("%w: peer %s row %d of %d", data.ErrRowOutOfRange, peerID, row, reg.numRows)
		}
		dstIdx[i] = C.int(row)
	}
	id := t.nextID.Add(1)
	if !t.posts.push(post{id: id, peerID: peerID, gen: reg.gen, src: srcIdx, dst: dstIdx, queued: time.Now()}) {
		return 0, data.ErrClosed
	}
	return id, nil
}

// Cancel implements data.Canceler for a write not yet posted: it is taken
// from the queue and reported failed with data.ErrCanceled, and no byte of
// it is written. A posted WRITE is left to finish (or fail at
// TransferTimeout): releasing it makes NIXL cancel it in the backend, but
// bytes already handed to the network may still land, and the caller would
// then hand the rows back too early (docs/nixl.md).
func (t *Transport) Cancel(peerID string, id uint64) {
	if t.posts.cancel(peerID, id) {
		t.completions.push(data.Completion{PeerID: peerID, ID: id, Err: data.ErrCanceled})
	}
}

// Close fails running transfers, releases everything NIXL holds and
// destroys the agent. It is idempotent.
func (t *Transport) Close() error {
	t.stopOnce.Do(func() {
		close(t.stop)
		select {
		case <-t.ownerDone:
			t.closeErr = t.teardownErr
		case <-time.After(t.opts.CloseTimeout):
			t.closeErr = fmt.Errorf("nixl transport: teardown still running after %v", t.opts.CloseTimeout)
		}
	})
	return t.closeErr
}

func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40 // version 4
	b[8] = b[8]&0x3f | 0x80 // RFC 4122 variant
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

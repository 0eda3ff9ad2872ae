package tcpdata

import (
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/peerkv/peerkv/core/data"
)

// Defaults for zero Options fields.
const (
	DefaultIOTimeout   = 10 * time.Second
	DefaultIdleTimeout = 60 * time.Second
	DefaultStreams     = 2
	// DefaultMaxConns and DefaultMaxConnsPerHost bound inbound data
	// connections that finished the hello: 128 peers at two streams each
	// fit with room, and one source address cannot take them all.
	DefaultMaxConns        = 1024
	DefaultMaxConnsPerHost = 64
	// DefaultMaxHelloConns and DefaultMaxHelloConnsPerHost bound
	// connections still in the hello, a budget of their own: strangers
	// cannot take the places of writers that proved themselves, and when
	// it is full the one furthest from finishing a hello is closed so a
	// newcomer gets in (all 128 peers' streams may dial at once).
	DefaultMaxHelloConns        = 256
	DefaultMaxHelloConnsPerHost = 32
	// DefaultHelloTimeout bounds the hello, TLS included (less when
	// IOTimeout is lower): it takes a round trip or three.
	DefaultHelloTimeout = 3 * time.Second
	// DefaultMaxHeldBytes bounds what the receiver holds for all parts in
	// flight (their destination rows and a staged row each); raised to
	// fit two of the largest parts the region allows.
	DefaultMaxHeldBytes = 128 << 20
	// completionBuffer bounds unread completions before senders wait.
	completionBuffer = 4096
	// minPartBytes keeps small transfers on one connection: splitting a
	// transfer only pays when each part is large. It is also the first
	// part's size on a connection whose speed is not known yet.
	minPartBytes = 256 << 10
	// maxPartBytes bounds one part however fast the link.
	maxPartBytes = 64 << 20
	// partDuration is how long a sender sizes a part to last at its
	// connection's measured speed: long enough that the ack's round trip
	// costs little, short enough that a canceled transfer's part on the
	// wire puts little more on the link where it must run to its end (a
	// receiver that reads no segments; others stop it within a segment).
	partDuration = 50 * time.Millisecond
	// maxUnsentBytes bounds what a producer connection leaves queued in
	// the kernel (limitUnsent), about 20 ms of a 100 Mbit/s link.
	maxUnsentBytes = 256 << 10
	// indexShare keeps a part's row bytes at least this many times its
	// header's row indices (8 bytes per row of the whole transfer).
	indexShare = 32
)

// Options configure a Transport. Zero durations and counts take defaults.
type Options struct {
	// LocalID is this node's id, sent to receivers so their guard knows
	// who writes.
	LocalID string
	// Region is this node's primary region: rows are sent from it and
	// received into it.
	Region data.Region
	// Guard decides which rows a peer may write here (nil allows all). It
	// is called for every row of every part, concurrently, while the writer
	// waits under its IOTimeout: it must be fast.
	Guard data.WriteGuard
	// ListenHost and ListenPort are where the data listener binds
	// (ListenPort 0 = ephemeral). DataAddr reports the bound address.
	ListenHost string
	ListenPort int
	// AdvertiseHost, when set, replaces the bound host in DataAddr (the
	// address peers dial): a listener bound to a wildcard cannot be dialed
	// at "0.0.0.0".
	AdvertiseHost string
	// AuthSecret, when set, is required of every writer (HMAC over a
	// challenge) and used to answer receivers' challenges.
	AuthSecret string
	// Encrypt runs every data connection under TLS 1.3, authenticated by
	// AuthSecret (required) bound to the TLS channel. Every peer must set
	// it alike: a mismatch fails the hello, naming the setting.
	Encrypt bool
	// IOTimeout bounds every read and write without progress, the dial,
	// the handshake and the wait for an ack (default 10 s).
	IOTimeout time.Duration
	// IdleTimeout closes a producer's connection unused this long
	// (default 60 s); receivers drop connections idle twice as long.
	IdleTimeout time.Duration
	// Streams is the number of parallel connections per peer (default 2).
	Streams int
	// RequireGrant refuses writers that do not prove the data token we
	// granted their peer id's current session (see Grant).
	RequireGrant bool
	// MaxConns and MaxConnsPerHost bound inbound connections that
	// finished the hello, in all and from one source IP (defaults 1024 and
	// 64); a hello beyond them is refused.
	MaxConns        int
	MaxConnsPerHost int
	// MaxHelloConns and MaxHelloConnsPerHost bound inbound connections
	// still in the hello (defaults 256 and 32); a connection beyond them
	// closes the oldest one still in the hello (from that IP, or at all).
	MaxHelloConns        int
	MaxHelloConnsPerHost int
	// HelloTimeout bounds an inbound hello, TLS handshake included
	// (default the lower of 3 s and IOTimeout).
	HelloTimeout time.Duration
	// MaxHeldBytes bounds the memory held for the parts being received on
	// all connections (default 128 MiB, at least two of the largest
	// parts); a part waits for room at most half an IOTimeout.
	MaxHeldBytes int64
	// SocketBufferBytes sets SO_SNDBUF/SO_RCVBUF on data connections
	// (0 = leave the kernel's autotuning on, usually the fastest).
	SocketBufferBytes int

	// withoutSegments (tests) makes the hello offer no segmented parts, as
	// a receiver before them did.
	withoutSegments bool
	// Logf receives diagnostics (nil = silent).
	Logf func(format string, args ...any)
}

func (o *Options) validate() error {
	if o.Region.RowLen == 0 || uint64(len(o.Region.Mem))%o.Region.RowLen != 0 {
		return fmt.Errorf("tcpdata: region of %d bytes is not a whole number of %d-byte rows", len(o.Region.Mem), o.Region.RowLen)
	}
	if o.LocalID == "" || len(o.LocalID) > maxPeerIDLen {
		return fmt.Errorf("tcpdata: LocalID must be 1 to %d bytes", maxPeerIDLen)
	}
	if o.ListenHost == "" {
		return errors.New("tcpdata: ListenHost is required")
	}
	if o.Encrypt && o.AuthSecret == "" {
		return errors.New("tcpdata: Encrypt needs AuthSecret: the secret is what authenticates TLS peers")
	}
	if o.IOTimeout < 0 || o.IdleTimeout < 0 || o.HelloTimeout < 0 || o.Streams < 0 || o.SocketBufferBytes < 0 ||
		o.MaxConns < 0 || o.MaxConnsPerHost < 0 || o.MaxHelloConns < 0 || o.MaxHelloConnsPerHost < 0 || o.MaxHeldBytes < 0 {
		return errors.New("tcpdata: negative timeout, stream count, connection bound or buffer size")
	}
	if o.IOTimeout == 0 {
		o.IOTimeout = DefaultIOTimeout
	}
	if o.IdleTimeout == 0 {
		o.IdleTimeout = DefaultIdleTimeout
	}
	if o.Streams == 0 {
		o.Streams = DefaultStreams
	}
	if o.MaxConns == 0 {
		o.MaxConns = DefaultMaxConns
	}
	if o.MaxConnsPerHost == 0 {
		o.MaxConnsPerHost = DefaultMaxConnsPerHost
	}
	if o.MaxHelloConns == 0 {
		o.MaxHelloConns = DefaultMaxHelloConns
	}
	if o.MaxHelloConnsPerHost == 0 {
		o.MaxHelloConnsPerHost = DefaultMaxHelloConnsPerHost
	}
	if o.HelloTimeout == 0 {
		o.HelloTimeout = min(DefaultHelloTimeout, o.IOTimeout)
	}
	if o.MaxHeldBytes == 0 {
		o.MaxHeldBytes = DefaultMaxHeldBytes
	}
	o.MaxHeldBytes = max(o.MaxHeldBytes, 2*largestPartBytes(o.Region))
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	return nil
}

// Transport is a TCP data path; see the package documentation.
type Transport struct {
	opts     Options
	region   data.Region
	listener net.Listener
	addr     string
	tls      *tlsConfigs // nil in plaintext mode

	held      *byteBudget // what parts being received hold, for all connections
	stagePool sync.Pool   // *[]byte of one row, for guarded parts (counted in held)
	logs      rateLog     // receiver diagnostics, rate-limited per cause
	stats     inboundCounters

	mu      sync.Mutex
	links   map[string]*peerLink
	pending map[uint64]*transfer
	inbound map[net.Conn]*inboundConn
	admit   admission         // inbound connection counts; see admit.go
	tokens  map[string]string // peer id -> its session's data token (Grant)
	nextID  uint64
	// betweenReads, when set (tests), runs in summed writes after each
	// batch's send and before its sums (SetBetweenReads).
	betweenReads func(peerID string, src []uint64)
	closed       bool

	outbox  *data.Outbox
	closing chan struct{} // closed when Close starts
	workers sync.WaitGroup
}

// transfer is one Write; its fields are guarded by Transport.mu, except
// src, dst (read-only) and next (the link's queue owns it).
type transfer struct {
	id       uint64
	link     *peerLink
	src, dst []uint64
	next     int   // first row not yet handed to a sender (peerLink.mu)
	rowsLeft int   // rows not yet acked
	onWire   int   // parts being sent right now
	err      error // the first part's failure, or ErrCanceled: the rest are skipped
	done     bool  // reported
	// sums (summed writes) gets each source row's sum, parallel to src,
	// taken by the part's sender right after writev read the row; parts
	// fill disjoint ranges.
	sums         []uint64
	betweenReads func(peerID string, src []uint64) // tests: after a batch's send, before its sums
}

var (
	_ data.Transport = (*Transport)(nil)
	_ data.Canceler  = (*Transport)(nil)
	_ data.Summer    = (*Transport)(nil)
)

// New binds the data listener and starts accepting writers.
func New(opts Options) (*Transport, error) {
	if err := opts.validate(); err != nil {
		return nil, err
	}
	var tlsConf *tlsConfigs
	if opts.Encrypt {
		var err error
		if tlsConf, err = newTLSConfigs(); err != nil {
			return nil, err
		}
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(opts.ListenHost, strconv.Itoa(opts.ListenPort)))
	if err != nil {
		return nil, fmt.Errorf("tcpdata: listen: %w", err)
	}
	t := &Transport{
		opts:     opts,
		region:   opts.Region,
		listener: ln,
		addr:     advertisedAddr(ln.Addr(), opts.AdvertiseHost),
		tls:      tlsConf,
		links:    map[string]*peerLink{},
		pending:  map[uint64]*transfer{},
		inbound:  map[net.Conn]*inboundConn{},
		admit:    newAdmission(),
		held:     newByteBudget(opts.MaxHeldBytes),
		logs:     newRateLog(opts.Logf, logInterval),
		tokens:   map[string]string{},
		outbox:   data.NewOutbox(completionBuffer),
		closing:  make(chan struct{}),
	}
	rowLen := opts.Region.RowLen
	t.stagePool.New = func() any { b := make([]byte, rowLen); return &b }
	t.goSafe("accept loop", t.acceptLoop)
	return t, nil
}

// goSafe runs fn on a tracked goroutine that logs instead of crashing.
func (t *Transport) goSafe(what string, fn func()) {
	t.workers.Add(1)
	go func() {
		defer t.workers.Done()
		defer func() {
			if p := recover(); p != nil {
				t.opts.Logf("tcpdata: panic in %s: %v", what, p)
			}
		}()
		fn()
	}()
}

// Name implements data.Transport.
func (t *Transport) Name() string { return "tcp" }

// AgentMetadata implements data.Transport; TCP needs none.
func (t *Transport) AgentMetadata() []byte { return nil }

// DataAddr is the listener address peers dial, "host:port": the bound one,
// with Options.AdvertiseHost in place of the host when set.
func (t *Transport) DataAddr() string { return t.addr }

func advertisedAddr(bound net.Addr, host string) string {
	if host == "" {
		return bound.String()
	}
	_, port, err := net.SplitHostPort(bound.String())
	if err != nil {
		return bound.String()
	}
	return net.JoinHostPort(host, port)
}

// AddPeer registers peerID's data listener. Adding a peer again with a new
// address replaces its link and fails the old link's transfers.
func (t *Transport) AddPeer(peerID string, info data.PeerInfo) error {
	if info.RowLen != t.region.RowLen {
		return fmt.Errorf("tcpdata: peer %s row length %d differs from ours %d", peerID, info.RowLen, t.region.RowLen)
	}
	if _, _, err := net.SplitHostPort(info.DataAddr); err != nil {
		return fmt.Errorf("tcpdata: peer %s data address %q: %w", peerID, info.DataAddr, err)
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return data.ErrClosed
	}
	old := t.links[peerID]
	if old != nil && old.addr == info.DataAddr && old.token == info.DataToken {
		t.mu.Unlock()
		return nil
	}
	link := newPeerLink(t, peerID, info.DataAddr)
	link.token = info.DataToken
	t.links[peerID] = link
	for range t.opts.Streams {
		t.goSafe("sender "+peerID, link.runStream)
	}
	t.mu.Unlock()
	if old != nil {
		t.dropLink(old, fmt.Errorf("%w: %s re-added with a new data address or session", data.ErrUnknownPeer, peerID))
	}
	return nil
}

// RemovePeer forgets peerID, closes its connections and fails its transfers.
func (t *Transport) RemovePeer(peerID string) {
	t.mu.Lock()
	link := t.links[peerID]
	if link != nil {
		delete(t.links, peerID)
	}
	t.mu.Unlock()
	if link != nil {
		t.dropLink(link, fmt.Errorf("%w: %s removed while the transfer was pending", data.ErrUnknownPeer, peerID))
	}
}

// dropLink fails every transfer link carries, then shuts it down. The
// reason is recorded before the connections close, so a sender whose write
// the shutdown cuts reports reason, not "use of closed network connection".
func (t *Transport) dropLink(link *peerLink, reason error) {
	t.mu.Lock()
	var failed []*transfer
	for _, tr := range t.pending {
		if tr.link == link {
			failed = append(failed, tr)
			if tr.err == nil {
				tr.err = reason
			}
		}
	}
	t.mu.Unlock()
	link.shutdown() // cuts the parts on the wire: they finish (failed) promptly
	for _, tr := range failed {
		t.finishPart(tr, 0, reason, false)
	}
}

// Write queues local rows src[i] for the peer's rows dst[i] and returns at
// once. Argument errors (lengths, a source row outside our region, an
// unknown peer, a closed transport) are returned; everything the receiver
// decides arrives on Completions.
func (t *Transport) Write(peerID string, src, dst []uint64) (uint64, error) {
	return t.write(peerID, src, dst, false)
}

// WriteSummed implements data.Summer: Write, whose senders sum each source
// row right after writev read it for the send, while it is in the cache;
// the successful completion carries the sums.
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
		return 0, fmt.Errorf("tcpdata: %d source rows but %d destination rows", len(src), len(dst))
	}
	if len(src) > maxTransferRows {
		return 0, fmt.Errorf("tcpdata: %d rows in one transfer, at most %d", len(src), maxTransferRows)
	}
	for _, row := range src {
		if row >= t.region.NumRows() {
			return 0, fmt.Errorf("%w: source row %d, region has %d", data.ErrRowOutOfRange, row, t.region.NumRows())
		}
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return 0, data.ErrClosed
	}
	link := t.links[peerID]
	if link == nil {
		t.mu.Unlock()
		return 0, fmt.Errorf("%w: %s", data.ErrUnknownPeer, peerID)
	}
	t.nextID++
	tr := &transfer{id: t.nextID, link: link, src: slices.Clone(src), dst: slices.Clone(dst), rowsLeft: len(src)}
	if summed {
		tr.sums, tr.betweenReads = make([]uint64, len(src)), t.betweenReads
	}
	if len(src) > 0 {
		t.pending[tr.id] = tr
	}
	t.mu.Unlock()
	if len(src) == 0 {
		t.report(data.Completion{PeerID: peerID, ID: tr.id, Sums: tr.sums})
		return tr.id, nil
	}
	link.enqueue(tr)
	return tr.id, nil
}

// Cancel implements data.Canceler: the transfer's rows not yet handed to a
// sender are dropped, a part waiting for a connection is not sent, a part
// on the wire stops at the end of its segment with a cancel marker (to a
// receiver without segments it runs to its end, sized to last about
// partDuration), and the transfer is then reported failed with
// data.ErrCanceled once the receiver acked each such part, having read
// every byte sent of it: so no byte of it can land after the report (a
// reset connection's bytes could still be read after the consumer handed
// its rows back, which is why parts are never cut by a reset).
func (t *Transport) Cancel(peerID string, id uint64) {
	t.mu.Lock()
	tr := t.pending[id]
	if t.closed || tr == nil || tr.link.peerID != peerID || tr.done {
		t.mu.Unlock()
		return
	}
	if tr.err == nil {
		tr.err = data.ErrCanceled // senders skip its parts from now on
	}
	// Reported off the caller's goroutine: the caller may be the one that
	// reads Completions. Started under mu, so Close waits for it.
	t.goSafe("cancel report", func() { t.finishPart(tr, 0, data.ErrCanceled, false) })
	t.mu.Unlock()
	tr.link.unqueue(tr)
}

// canceled says whether tr failed or was canceled: its parts are skipped.
func (t *Transport) canceled(tr *transfer) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	return tr.err != nil
}

// startPart puts a part of tr on the wire, unless tr already failed (its
// queued parts are then skipped).
func (t *Transport) startPart(tr *transfer) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if tr.done || tr.err != nil {
		return false
	}
	tr.onWire++
	return true
}

// finishPart records one part's outcome (rows written, or err; onWire: it
// was being sent) and reports the transfer once: when its last row was
// acked, or after a failure once no part of it is on the wire any more. A
// failure is never reported while another part still writes rows: the
// consumer, told the transfer failed, hands those rows back to its host.
func (t *Transport) finishPart(tr *transfer, rows int, err error, onWire bool) {
	t.mu.Lock()
	if tr.done {
		t.mu.Unlock()
		return
	}
	if onWire {
		tr.onWire--
	}
	firstErr := false
	if err == nil {
		tr.rowsLeft -= rows
	} else if tr.err == nil {
		tr.err, firstErr = err, true
	}
	if tr.onWire > 0 || (tr.err == nil && tr.rowsLeft > 0) {
		t.mu.Unlock()
		if firstErr {
			tr.link.unqueue(tr) // its other rows are not sent
		}
		return
	}
	tr.done = true
	delete(t.pending, tr.id)
	err = tr.err
	t.mu.Unlock()
	if firstErr {
		tr.link.unqueue(tr)
	}
	c := data.Completion{PeerID: tr.link.peerID, ID: tr.id, Err: err}
	if err == nil {
		c.Sums = tr.sums
	}
	t.report(c)
}

// report delivers a completion, logging one dropped at shutdown.
func (t *Transport) report(c data.Completion) {
	if !t.outbox.Send(c) {
		t.opts.Logf("tcpdata: dropped completion of transfer %d to %s: transport closing", c.ID, c.PeerID)
	}
}

// Completions implements data.Transport. It is closed when Close returns.
func (t *Transport) Completions() <-chan data.Completion { return t.outbox.C() }

// Close stops the listener and every connection, fails pending transfers
// and returns after all goroutines exited. It is idempotent.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	close(t.closing)
	t.outbox.StartClosing()
	links := make([]*peerLink, 0, len(t.links))
	for _, link := range t.links {
		links = append(links, link)
	}
	t.links = map[string]*peerLink{}
	for c := range t.inbound {
		_ = c.Close()
	}
	t.mu.Unlock()

	err := t.listener.Close()
	for _, link := range links {
		t.dropLink(link, data.ErrClosed)
	}
	t.workers.Wait()

	t.outbox.Finish()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("tcpdata: close listener: %w", err)
	}
	return nil
}

// tuneConn applies socket options to a data connection.
func (t *Transport) tuneConn(c net.Conn) {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return
	}
	if n := t.opts.SocketBufferBytes; n > 0 {
		_ = tc.SetReadBuffer(n)
		_ = tc.SetWriteBuffer(n)
	}
}

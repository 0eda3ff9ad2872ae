// Package hostile attacks a live peerkv node (core/node.Open, real ZMQ on
// 127.0.0.x) the way a party on the network could: a raw peer written on
// pebbe/zmq4 directly that claims whatever identity it likes, picks its
// source address, completes a correct handshake and then lies, or never
// handshakes at all. The tests are in the _test.go files, one per theme.
//
// An Attacker owns one ROUTER per identity it can be answered under (a node
// dials back the peer id a DEALER claims, so answering needs a ROUTER bound
// at that "host:port") and any number of DEALERs whose identity it chooses.
// Every socket is used on the test goroutine only; the TCP data sink runs
// its own goroutines and shares nothing but atomics with the test.
package hostile

import (
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/ugorji/go/codec"

	"github.com/peerkv/peerkv/core/protocol"
)

// Layout every node and the attacker agree on (unless a case lies about it).
const (
	RowLen      = 4096
	NumRows     = 64
	KeyLen      = 36
	HashSeed    = "42"
	Fingerprint = "0123456789abcdef"
)

// mp encodes and decodes the attacker's hand-built maps. WriteExt writes
// []byte as bin and string as str, as msgspec does.
var mp = func() *codec.MsgpackHandle {
	h := &codec.MsgpackHandle{WriteExt: true, PositiveIntUnsigned: true}
	h.MapType = reflect.TypeOf(map[string]any(nil))
	h.RawToString = false
	return h
}()

// EncodeMap encodes m as one msgpack map (for messages protocol.Encode would
// refuse or does not know).
func EncodeMap(m map[string]any) []byte {
	var out []byte
	if err := codec.NewEncoderBytes(&out, mp).Encode(m); err != nil {
		panic(fmt.Sprintf("hostile: encode %v: %v", m, err))
	}
	return out
}

// Frame is one message the attacker received.
type Frame struct {
	From string // the sender's ZMQ identity: its peer id
	To   string // which of the attacker's identities it was sent to
	Raw  []byte
	Type string         // the "type" key; "" when the frame is not such a map
	Map  map[string]any // nil when the frame is not a map
}

func decodeFrame(from, to string, raw []byte) Frame {
	f := Frame{From: from, To: to, Raw: raw}
	var v any
	if err := codec.NewDecoderBytes(raw, mp).Decode(&v); err == nil {
		if m, ok := v.(map[string]any); ok {
			f.Map = m
			f.Type, _ = m["type"].(string)
		}
	}
	return f
}

// Str, Bytes, Bool, Uint and Sub read one key of the map (zero if absent or
// of another type).
func (f Frame) Str(k string) string   { s, _ := f.Map[k].(string); return s }
func (f Frame) Bytes(k string) []byte { b, _ := f.Map[k].([]byte); return b }
func (f Frame) Bool(k string) bool    { b, _ := f.Map[k].(bool); return b }
func (f Frame) Uint(k string) uint64  { return asUint(f.Map[k]) }
func (f Frame) Sub(k string) map[string]any {
	m, _ := f.Map[k].(map[string]any)
	return m
}

func asUint(v any) uint64 {
	switch n := v.(type) {
	case uint64:
		return n
	case int64:
		if n >= 0 {
			return uint64(n)
		}
	}
	return 0
}

func (f Frame) String() string {
	if f.Type == "" {
		return fmt.Sprintf("%d undecodable bytes %s -> %s", len(f.Raw), f.From, f.To)
	}
	return fmt.Sprintf("%s %s -> %s", f.Type, f.From, f.To)
}

// Attacker is the raw hostile peer; see the package comment.
type Attacker struct {
	t       testing.TB
	ctx     *zmq.Context
	ID      string                 // the identity NewAttacker bound first
	routers map[string]*zmq.Socket // identity -> ROUTER bound there
	poller  *zmq.Poller
	byPoll  map[*zmq.Socket]string
	inbox   []Frame
	conns   []*Conn
	Sink    *DataSink // a TCP data listener it advertises as data_addr
}

// NewAttacker binds one ROUTER at host:<free port> (its identity ID) and a
// TCP data sink on host; Close runs at the end of the test.
func NewAttacker(t testing.TB, host string) *Attacker {
	t.Helper()
	ctx, err := zmq.NewContext()
	if err != nil {
		t.Fatalf("zmq context: %v", err)
	}
	a := &Attacker{t: t, ctx: ctx, routers: map[string]*zmq.Socket{}}
	a.ID = a.Listen(host)
	a.Sink = newDataSink(t, host)
	t.Cleanup(a.Close)
	return a
}

// Listen binds another ROUTER at host:<free port> and returns that identity.
func (a *Attacker) Listen(host string) string {
	a.t.Helper()
	for range 20 {
		id := net.JoinHostPort(host, strconv.Itoa(FreePort(a.t, host)))
		r, err := a.ctx.NewSocket(zmq.ROUTER)
		if err != nil {
			a.t.Fatalf("router: %v", err)
		}
		_ = r.SetLinger(0)
		_ = r.SetRcvhwm(0)
		if err := r.Bind("tcp://" + id); err != nil {
			r.Close()
			continue // taken since FreePort checked it: try another
		}
		a.routers[id] = r
		a.rebuildPoller()
		return id
	}
	a.t.Fatalf("no free port on %s to bind a ROUTER", host)
	return ""
}

// Unlisten closes the ROUTER of identity id: whoever dials it now finds
// nothing there (the attacker is gone).
func (a *Attacker) Unlisten(id string) {
	if r := a.routers[id]; r != nil {
		r.Close()
		delete(a.routers, id)
		a.rebuildPoller()
	}
}

// Relisten replaces identity id's ROUTER by a fresh one at the same address
// (no connections, no identities seen), retrying the bind for up to 2 s.
func (a *Attacker) Relisten(id string) {
	a.t.Helper()
	a.Unlisten(id)
	deadline := time.Now().Add(2 * time.Second)
	for {
		r, err := a.ctx.NewSocket(zmq.ROUTER)
		if err != nil {
			a.t.Fatalf("router: %v", err)
		}
		_ = r.SetLinger(0)
		_ = r.SetRcvhwm(0)
		if err = r.Bind("tcp://" + id); err == nil {
			a.routers[id] = r
			a.rebuildPoller()
			return
		}
		r.Close()
		if time.Now().After(deadline) {
			a.t.Fatalf("rebind %s: %v", id, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (a *Attacker) rebuildPoller() {
	a.poller = zmq.NewPoller()
	a.byPoll = map[*zmq.Socket]string{}
	for id, r := range a.routers {
		a.poller.Add(r, zmq.POLLIN)
		a.byPoll[r] = id
	}
}

// Conn is one DEALER of the attacker toward one target.
type Conn struct {
	a        *Attacker
	Target   string // the target's peer id
	Identity string // the ZMQ identity this DEALER claims
	dealer   *zmq.Socket
}

// Dial opens a DEALER claiming identity toward target ("host:port"). With a
// non-empty src the connection leaves from that address (libzmq's
// "tcp://SRC:0;DST:PORT" form), so the target sees it come from src.
func (a *Attacker) Dial(target, identity, src string) *Conn {
	a.t.Helper()
	d, err := a.ctx.NewSocket(zmq.DEALER)
	if err != nil {
		a.t.Fatalf("dealer: %v", err)
	}
	_ = d.SetLinger(0)
	_ = d.SetSndhwm(0)
	_ = d.SetRcvhwm(0)
	// A DEALER with no connection up (the victim shut it, or refused its
	// handshake and it is between redials) blocks a send until one is:
	// an attacker drops the frame instead, after a bounded wait.
	_ = d.SetSndtimeo(attackerSendWait)
	if err := d.SetIdentity(identity); err != nil {
		a.t.Fatalf("identity %q: %v", identity, err)
	}
	ep := "tcp://" + target
	if src != "" {
		ep = "tcp://" + src + ":0;" + target
	}
	if err := d.Connect(ep); err != nil {
		a.t.Fatalf("connect %s: %v", ep, err)
	}
	c := &Conn{a: a, Target: target, Identity: identity, dealer: d}
	a.conns = append(a.conns, c)
	return c
}

// attackerSendWait bounds how long a send waits for a connection to the
// victim to be up; past it the frame is dropped, as nothing could carry it.
const attackerSendWait = 2 * time.Second

// SendRaw sends b as one frame, whatever it holds. With no connection up
// to the victim within attackerSendWait, the frame is dropped.
func (c *Conn) SendRaw(b []byte) {
	c.a.t.Helper()
	if c.dealer == nil {
		c.a.t.Fatalf("send on closed conn %s -> %s", c.Identity, c.Target)
	}
	if _, err := c.dealer.SendBytes(b, 0); err != nil {
		if zmq.AsErrno(err) == zmq.Errno(syscall.EAGAIN) {
			return // no connection to the victim: nothing to send on
		}
		c.a.t.Fatalf("send %d bytes %s -> %s: %v", len(b), c.Identity, c.Target, err)
	}
}

// Send sends a well-formed message (protocol.Encode).
func (c *Conn) Send(m protocol.Message) {
	c.a.t.Helper()
	b, err := protocol.Encode(m)
	if err != nil {
		c.a.t.Fatalf("encode %T: %v", m, err)
	}
	c.SendRaw(b)
}

// SendMap sends a hand-built map.
func (c *Conn) SendMap(m map[string]any) { c.a.t.Helper(); c.SendRaw(EncodeMap(m)) }

// Close drops the DEALER's connection at once (no goodbye).
func (c *Conn) Close() {
	if c.dealer != nil {
		c.dealer.Close()
		c.dealer = nil
	}
}

// CloseAfterFlush closes the DEALER once what it queued went out (up to 1 s).
func (c *Conn) CloseAfterFlush() {
	if c.dealer != nil {
		_ = c.dealer.SetLinger(time.Second)
		c.dealer.Close()
		c.dealer = nil
	}
}

// ConnectMsg is a plausible connect under id: our layout, the cluster's
// fingerprint and seed, TCP data path at the sink, no secret.
func (a *Attacker) ConnectMsg(id string) *protocol.Connect {
	return &protocol.Connect{
		PeerID: id, AgentMetadata: []byte{}, BaseAddr: 0, NumBlocks: NumRows, BlockLen: RowLen,
		ConfigFingerprint: Fingerprint, HashSeed: HashSeed,
		PeerKV: &protocol.Capabilities{Version: 2, DataTransport: "tcp", DataAddr: a.Sink.Addr(), Nonce: []byte{},
			Epoch: attackerEpoch},
	}
}

// attackerEpoch is the attacker's start, as a peerkv peer names its own:
// its connects come from one incarnation, so a second one is a duplicate.
const attackerEpoch = 0x5eed

// Pump reads every frame that arrived, waiting up to wait for the first.
func (a *Attacker) Pump(wait time.Duration) {
	if len(a.routers) == 0 {
		time.Sleep(wait)
		return
	}
	polled, err := a.poller.Poll(wait)
	if err != nil {
		return // EINTR and the like: the caller's loop polls again
	}
	for _, p := range polled {
		to := a.byPoll[p.Socket]
		for {
			parts, err := p.Socket.RecvMessageBytes(zmq.DONTWAIT)
			if err != nil {
				break
			}
			if len(parts) != 2 {
				continue
			}
			a.inbox = append(a.inbox, decodeFrame(string(parts[0]), to, parts[1]))
		}
	}
}

// Await returns (and removes) the first frame matching match, waiting up to
// within for it.
func (a *Attacker) Await(match func(Frame) bool, within time.Duration) (Frame, bool) {
	deadline := time.Now().Add(within)
	for {
		for i, f := range a.inbox {
			if match(f) {
				a.inbox = append(a.inbox[:i:i], a.inbox[i+1:]...)
				return f, true
			}
		}
		left := time.Until(deadline)
		if left <= 0 {
			return Frame{}, false
		}
		a.Pump(min(left, 20*time.Millisecond))
	}
}

// Take removes and returns every buffered frame matching match.
func (a *Attacker) Take(match func(Frame) bool) []Frame {
	var out, keep []Frame
	for _, f := range a.inbox {
		if match(f) {
			out = append(out, f)
		} else {
			keep = append(keep, f)
		}
	}
	a.inbox = keep
	return out
}

// Is matches frames of type typ ("" = any) from target to identity to ("" = any).
func Is(from, to, typ string) func(Frame) bool {
	return func(f Frame) bool {
		return f.From == from && (to == "" || f.To == to) && (typ == "" || f.Type == typ)
	}
}

// Await waits for a frame of type typ from the conn's target to its identity.
func (c *Conn) Await(typ string, within time.Duration) (Frame, bool) {
	return c.a.Await(Is(c.Target, c.Identity, typ), within)
}

// MustAwait is Await that fails the test on timeout.
func (c *Conn) MustAwait(typ string, within time.Duration) Frame {
	c.a.t.Helper()
	f, ok := c.Await(typ, within)
	if !ok {
		c.a.t.Fatalf("%s sent no %s to %s within %v", c.Target, typ, c.Identity, within)
	}
	return f
}

// Handshake runs a correct handshake as the dialing side (no secret): our
// connect, the target's connect, acks both ways. It returns the target's
// connect. The conn's identity must be one the attacker listens at.
func (c *Conn) Handshake(within time.Duration) Frame {
	c.a.t.Helper()
	c.Send(c.a.ConnectMsg(c.Identity))
	theirs := c.MustAwait("connect", within)
	c.Send(&protocol.ConnectAck{PeerID: c.Identity})
	c.MustAwait("connect_ack", within)
	return theirs
}

// Accept answers a session the target dialed toward the conn's identity
// (theirs is the target's connect, already received): our connect, acks.
func (c *Conn) Accept(within time.Duration) {
	c.a.t.Helper()
	c.Send(c.a.ConnectMsg(c.Identity))
	c.Send(&protocol.ConnectAck{PeerID: c.Identity})
	c.MustAwait("connect_ack", within)
}

// Close closes every socket and the sink.
func (a *Attacker) Close() {
	for _, c := range a.conns {
		c.Close()
	}
	for id := range a.routers {
		a.Unlisten(id)
	}
	_ = a.ctx.Term()
	a.Sink.Close()
}

// ---- ports ----------------------------------------------------------------

var (
	portMu     sync.Mutex
	portIssued = map[int]bool{}
	portRand   = rand.New(rand.NewPCG(uint64(os.Getpid()), uint64(time.Now().UnixNano())))
)

// FreePort returns a TCP port free on host right now, below the kernel's
// ephemeral range (a port bind(0) handed out is itself ephemeral, so an
// outgoing connection may take it between our check and the node's bind),
// never the same one twice in this process.
func FreePort(t testing.TB, host string) int {
	t.Helper()
	p, err := freePortBelowEphemeral(host)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// freePortBelowEphemeral is FreePort for a process without a testing.T
// (the victim child).
func freePortBelowEphemeral(host string) (int, error) {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil && n > 21000 {
				low = min(n, 32768)
			}
		}
	}
	portMu.Lock()
	defer portMu.Unlock()
	for range 500 {
		p := 20000 + portRand.IntN(low-20000)
		if portIssued[p] {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort(host, strconv.Itoa(p)))
		if err != nil {
			continue
		}
		_ = ln.Close()
		portIssued[p] = true
		return p, nil
	}
	return 0, fmt.Errorf("no free port on %s below %d", host, low)
}

// ---- TCP data sink ------------------------------------------------------------

// DataSink is a minimal receiver of peerkv's TCP data path (plaintext,
// version 1 of core/data/tcpdata's wire): it accepts what a producer writes
// to the attacker, counts the rows and acks them, so a target's writes
// toward the attacker succeed.
type DataSink struct {
	ln    net.Listener
	rows  atomic.Int64
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns map[net.Conn]struct{}
}

func newDataSink(t testing.TB, host string) *DataSink {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatalf("data sink: %v", err)
	}
	s := &DataSink{ln: ln, conns: map[net.Conn]struct{}{}}
	s.wg.Add(1)
	go s.accept()
	return s
}

// Addr is the sink's "host:port".
func (s *DataSink) Addr() string { return s.ln.Addr().String() }

// Rows counts the rows received so far.
func (s *DataSink) Rows() int64 { return s.rows.Load() }

func (s *DataSink) accept() {
	defer s.wg.Done()
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.mu.Lock()
		s.conns[c] = struct{}{}
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() {
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
				_ = c.Close()
			}()
			_ = s.serve(c)
		}()
	}
}

func (s *DataSink) serve(c net.Conn) error {
	le := binary.LittleEndian
	deadline := func() { _ = c.SetDeadline(time.Now().Add(10 * time.Second)) }
	deadline()
	hello := make([]byte, 8+32) // magic u32 | version u8 | auth_required u8 | pad u16 | nonce
	le.PutUint32(hello[0:], 0x44564b50)
	hello[4] = 1
	if _, err := c.Write(hello); err != nil {
		return err
	}
	var ch [16 + 32]byte // magic | version | pad | id_len u16 | row_len u64 | mac
	if _, err := io.ReadFull(c, ch[:]); err != nil {
		return err
	}
	if _, err := io.CopyN(io.Discard, c, int64(le.Uint16(ch[6:]))); err != nil {
		return err
	}
	if _, err := c.Write([]byte{0, 0, 0, 0}); err != nil { // status ok, no reason
		return err
	}
	for {
		deadline()
		var h [32]byte // magic | part_rows u32 | transfer_id u64 | row_len u64 | total_rows u32 | first u32
		if _, err := io.ReadFull(c, h[:]); err != nil {
			return err
		}
		if le.Uint32(h[0:]) != 0x50564b50 {
			return fmt.Errorf("bad part magic")
		}
		partRows, id, rowLen, total := le.Uint32(h[4:]), le.Uint64(h[8:]), le.Uint64(h[16:]), le.Uint32(h[24:])
		if rowLen > 1<<26 || total > 1<<20 {
			return fmt.Errorf("implausible part")
		}
		if _, err := io.CopyN(io.Discard, c, int64(total)*8+int64(partRows)*int64(rowLen)); err != nil {
			return err
		}
		s.rows.Add(int64(partRows))
		var ack [24]byte // transfer_id | status | pad | row
		le.PutUint64(ack[0:], id)
		if _, err := c.Write(ack[:]); err != nil {
			return err
		}
	}
}

// Close stops the sink and waits for its goroutines.
func (s *DataSink) Close() {
	_ = s.ln.Close()
	s.mu.Lock()
	for c := range s.conns {
		_ = c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
}

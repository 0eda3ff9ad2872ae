package hostile

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/peerkv/peerkv/core/protocol"
)

// The attack drivers of availability_test.go: issue 34's items 1-5 and 8,
// as a party on the network runs them against a live node. Each driver is
// set up on the test goroutine (dials, handshakes) and then runs on a
// goroutine of its own until halt closes or its byte budget is spent; its
// connections stay open until the test ends, so what they made the victim
// hold is still held when the figures are read.

// attackTarget is what an attack aims at.
type attackTarget struct {
	mode      string // "default", "auth" or "encrypt": the attacker holds no secret in any
	ctl       string // the victim's peer id (control address)
	data      string // the victim's TCP data address
	rows      int    // rows in the victim's region
	legitData string // the TCP data address of the legitimate consumer that pulls during the attack
}

// attackDriver is one attack: setup runs on the test goroutine and returns the
// loop, which must stop soon after halt closes.
type attackDriver struct {
	setup func(t *testing.T, tg attackTarget) (loop func(halt <-chan struct{}))
}

// ---- frames ------------------------------------------------------------------------

// lookupFrame is a well-formed lookup of n distinct 36-byte keys under a
// kv_request_id of kvLen bytes ('0' filled; patchKV rewrites it in place),
// built by hand so that multi-MiB frames cost no [][]byte.
func lookupFrame(n, kvLen int) []byte {
	b := make([]byte, 0, 64+kvLen+n*(2+KeyLen))
	b = append(b, 0x84)
	b = append(b, str8("type")...)
	b = append(b, str8("lookup")...)
	b = append(b, str8("kv_request_id")...)
	b = append(b, 0xd9, byte(kvLen))
	for range kvLen {
		b = append(b, '0')
	}
	b = append(b, str8("keys")...)
	b = append(b, 0xdd)
	b = binary.BigEndian.AppendUint32(b, uint32(n))
	var key [KeyLen]byte
	for i := range n {
		binary.LittleEndian.PutUint64(key[:], uint64(i)*0x9e3779b97f4a7c15+1)
		b = append(b, 0xc4, KeyLen)
		b = append(b, key[:]...)
	}
	b = append(b, str8("round_seq")...)
	return append(b, 0x00)
}

// kvOffset is where lookupFrame's kv_request_id starts: the map's byte,
// "type", "lookup", "kv_request_id" (each a str8: 2 bytes and the string),
// and the id's own str8 header.
const kvOffset = 1 + (2 + 4) + (2 + 6) + (2 + 13) + 2

// patchKV writes seq in decimal at the end of frame's kv_request_id, so one
// buffer serves as many lookups under distinct ids.
func patchKV(frame []byte, kvLen int, seq int) {
	s := fmt.Sprintf("%0*d", kvLen, seq)
	copy(frame[kvOffset:kvOffset+kvLen], s[len(s)-kvLen:])
}

var (
	framesMu sync.Mutex
	frames   = map[int][]byte{}
)

// sharedLookup is lookupFrame(n, 8), built once per process (never patched).
func sharedLookup(n int) []byte {
	framesMu.Lock()
	defer framesMu.Unlock()
	if frames[n] == nil {
		frames[n] = lookupFrame(n, 8)
	}
	return frames[n]
}

// ---- raw sockets -------------------------------------------------------------------------

// dialQueued is Attacker.Dial with a send queue of sndhwm messages, so an
// attack the victim pushes back on holds at most that much in our process.
func (a *Attacker) dialQueued(target, identity, src string, sndhwm int) *Conn {
	a.t.Helper()
	d, err := a.ctx.NewSocket(zmq.DEALER)
	if err != nil {
		a.t.Fatalf("dealer: %v", err)
	}
	_ = d.SetLinger(0)
	_ = d.SetSndhwm(sndhwm)
	_ = d.SetRcvhwm(1)
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

// listenDeaf binds a ROUTER that takes in at most one message and is read
// only while the handshake runs: a peer that has stopped reading, so what
// the victim sends it piles up on the victim's side.
func (a *Attacker) listenDeaf(host string) string {
	a.t.Helper()
	for range 20 {
		id := net.JoinHostPort(host, fmt.Sprint(FreePort(a.t, host)))
		r, err := a.ctx.NewSocket(zmq.ROUTER)
		if err != nil {
			a.t.Fatalf("router: %v", err)
		}
		_ = r.SetLinger(0)
		_ = r.SetRcvhwm(1)
		_ = r.SetRcvbuf(64 << 10)
		if err := r.Bind("tcp://" + id); err != nil {
			r.Close()
			continue
		}
		a.routers[id] = r
		a.rebuildPoller()
		return id
	}
	a.t.Fatalf("no free port on %s to bind a ROUTER", host)
	return ""
}

// trySend sends b without blocking; false when the queue is full (the
// victim pushes back) or the socket is gone.
func (c *Conn) trySend(b []byte) bool {
	if c.dealer == nil {
		return false
	}
	_, err := c.dealer.SendBytes(b, zmq.DONTWAIT)
	return err == nil
}

// handshakeOrClaim completes a handshake in default mode; with a secret the
// attacker, holding none, can only send its connect.
func handshakeOrClaim(tg attackTarget, c *Conn) Frame {
	if tg.mode == "default" {
		return c.Handshake(3 * time.Second)
	}
	c.Send(c.a.ConnectMsg(c.Identity))
	return Frame{}
}

// paceAttack runs step until halt closes or step reports the budget spent,
// sleeping a little whenever step made no progress.
func paceAttack(halt <-chan struct{}, step func() (progress, done bool)) {
	for {
		select {
		case <-halt:
			return
		default:
		}
		progress, done := step()
		if done {
			return
		}
		if !progress {
			select {
			case <-halt:
				return
			case <-time.After(2 * time.Millisecond):
			}
		}
	}
}

// ---- item 1: frames queued in libzmq before anyone reads them -------------------------

// sessionlessFloodAttack: 32 identities without a session (and without a
// secret) sending 65 536-key lookups as fast as the victim takes them.
func sessionlessFloodAttack() attackDriver {
	return attackDriver{func(t *testing.T, tg attackTarget) func(<-chan struct{}) {
		const idents, budget = 32, 384 << 20
		a := NewAttacker(t, "127.0.0.1")
		var cs []*Conn
		for range idents {
			cs = append(cs, a.dialQueued(tg.ctl, uniq("stranger"), "", 1))
		}
		frame := sharedLookup(1 << 16)
		return func(halt <-chan struct{}) {
			sent := 0
			paceAttack(halt, func() (bool, bool) {
				progress := false
				for _, c := range cs {
					if c.trySend(frame) {
						sent += len(frame)
						progress = true
					}
				}
				return progress, sent >= budget
			})
		}
	}}
}

// duplicateIdentitiesAttack: an identity is taken by one quiet connection; three
// more connections under the same identity, which the ROUTER never reads,
// each send five 32 MiB lookups.
func duplicateIdentitiesAttack() attackDriver {
	return attackDriver{func(t *testing.T, tg attackTarget) func(<-chan struct{}) {
		const dups, perDup = 3, 5
		a := NewAttacker(t, "127.0.0.1")
		id := uniq("taken")
		first := a.dialQueued(tg.ctl, id, "", 1)
		first.trySend(sharedLookup(1))
		time.Sleep(200 * time.Millisecond) // the first connection holds the identity
		var cs []*Conn
		for range dups {
			cs = append(cs, a.dialQueued(tg.ctl, id, "", 1))
		}
		frame := sharedLookup(32 << 20 / (2 + KeyLen))
		return func(halt <-chan struct{}) {
			sent := make([]int, len(cs))
			paceAttack(halt, func() (bool, bool) {
				progress, done := false, true
				for i, c := range cs {
					if sent[i] < perDup && c.trySend(frame) {
						sent[i]++
						progress = true
					}
					done = done && sent[i] == perDup
				}
				return progress, done
			})
		}
	}}
}

// ---- item 2: answers queued for peers that never read ---------------------------

// sessionsThatNeverReadAttack: four sessions (in default mode; with a secret the
// attacker gets none and its lookups are refused) whose ROUTER stops reading
// after the handshake, each sending 65 536-key lookups under fresh kv ids,
// so every answer is as large as its lookup.
func sessionsThatNeverReadAttack() attackDriver {
	return attackDriver{func(t *testing.T, tg attackTarget) func(<-chan struct{}) {
		const sessions, budget, kvLen = 4, 384 << 20, 12
		a := NewAttacker(t, "127.0.3.1")
		var cs []*Conn
		for range sessions {
			id := a.listenDeaf("127.0.3.1")
			c := a.dialQueued(tg.ctl, id, "127.0.3.1", 1)
			handshakeOrClaim(tg, c)
			cs = append(cs, c)
		}
		frame := lookupFrame(1<<16, kvLen)
		return func(halt <-chan struct{}) {
			sent, seq := 0, 0
			paceAttack(halt, func() (bool, bool) {
				progress := false
				for _, c := range cs {
					seq++
					patchKV(frame, kvLen, seq)
					if c.trySend(frame) {
						sent += len(frame)
						progress = true
					}
				}
				return progress, sent >= budget
			})
		}
	}}
}

// ---- item 3: sessionless multi-MiB lookups stall the scheduler thread ------------------

// hugeSessionlessLookupsAttack: one identity without a session sends a lookup of
// a million keys (36 MiB) every 250 ms.
func hugeSessionlessLookupsAttack() attackDriver {
	return attackDriver{func(t *testing.T, tg attackTarget) func(<-chan struct{}) {
		const frames = 8
		a := NewAttacker(t, "127.0.0.1")
		c := a.dialQueued(tg.ctl, uniq("huge"), "", 1)
		frame := sharedLookup(1_000_000)
		return func(halt <-chan struct{}) {
			sent := 0
			paceAttack(halt, func() (bool, bool) {
				if c.trySend(frame) {
					sent++
					select {
					case <-halt:
					case <-time.After(250 * time.Millisecond):
					}
				}
				return false, sent >= frames
			})
		}
	}}
}

// ---- items 4 and 5: the TCP data port -------------------------------------------------------

// hugePartHeadersAttack: in default mode the attacker takes a session (and its data
// token) and opens 32 data connections, each sending one part header that
// names every row of the victim's region (indices included; the guard
// refuses it), then stays connected. With a secret it has no token and its
// hellos are refused.
func hugePartHeadersAttack() attackDriver {
	return attackDriver{func(t *testing.T, tg attackTarget) func(<-chan struct{}) {
		const conns = 32
		a := NewAttacker(t, "127.0.4.1")
		id := a.Listen("127.0.4.1")
		c := a.Dial(tg.ctl, id, "127.0.4.1")
		theirs := handshakeOrClaim(tg, c)
		token := ""
		switch v := theirs.Sub("peerkv")["data_token"].(type) {
		case string:
			token = v
		case []byte:
			token = string(v)
		}
		var mu sync.Mutex
		var held []net.Conn
		t.Cleanup(func() {
			mu.Lock()
			defer mu.Unlock()
			for _, c := range held {
				_ = c.Close()
			}
		})
		return func(halt <-chan struct{}) {
			for i := range conns {
				select {
				case <-halt:
					return
				default:
				}
				conn, err := net.DialTimeout("tcp", tg.data, time.Second)
				if err != nil {
					continue
				}
				mu.Lock()
				held = append(held, conn)
				mu.Unlock()
				_ = sendHugePart(conn, id, token, uint64(i+1), uint32(min(tg.rows, 1<<20)))
			}
		}
	}}
}

// sendHugePart runs the plaintext writer's hello (version 1 of
// core/data/tcpdata's wire) as peer id with token, then one part naming
// totalRows destination rows (all row 0) and carrying one row.
func sendHugePart(c net.Conn, id, token string, transfer uint64, totalRows uint32) error {
	le := binary.LittleEndian
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	var hello [8 + 32]byte
	if _, err := io.ReadFull(c, hello[:]); err != nil {
		return err
	}
	if hello[4] != 1 {
		return fmt.Errorf("the receiver speaks version %d (TLS)", hello[4])
	}
	m := hmac.New(sha256.New, []byte("\x00peerkv-data-token\x00"+token))
	m.Write([]byte("peerkv/tcpdata/v1"))
	m.Write(hello[8:])
	var rl [8]byte
	le.PutUint64(rl[:], RowLen)
	m.Write(rl[:])
	m.Write([]byte(id))
	ch := make([]byte, 16, 16+32+len(id))
	le.PutUint32(ch[0:], 0x44564b50)
	ch[4] = 1
	le.PutUint16(ch[6:], uint16(len(id)))
	le.PutUint64(ch[8:], RowLen)
	ch = append(append(ch, m.Sum(nil)...), id...)
	if _, err := c.Write(ch); err != nil {
		return err
	}
	var st [4]byte
	if _, err := io.ReadFull(c, st[:]); err != nil {
		return err
	}
	if _, err := io.CopyN(io.Discard, c, int64(le.Uint16(st[2:]))); err != nil {
		return err
	}
	if st[0] != 0 {
		return fmt.Errorf("hello refused: status %d", st[0])
	}
	h := make([]byte, 32)
	le.PutUint32(h[0:], 0x50564b50)
	le.PutUint32(h[4:], 1) // part_rows
	le.PutUint64(h[8:], transfer)
	le.PutUint64(h[16:], RowLen)
	le.PutUint32(h[24:], totalRows)
	le.PutUint32(h[28:], 0) // first
	if _, err := c.Write(h); err != nil {
		return err
	}
	if _, err := c.Write(make([]byte, int(totalRows)*8+RowLen)); err != nil {
		return err
	}
	var ack [24]byte
	_, err := io.ReadFull(c, ack[:])
	return err
}

// slowlorisAttack: 64 connections to the legitimate consumer's data port from
// the victim's own address (127.0.0.1) that never send a hello, each
// redialled while the attack runs when the consumer closes it, and held
// after it until the test ends.
func slowlorisAttack() attackDriver {
	return attackDriver{func(t *testing.T, tg attackTarget) func(<-chan struct{}) {
		const conns = 64
		var mu sync.Mutex
		held := map[net.Conn]bool{}
		var readers sync.WaitGroup
		t.Cleanup(func() {
			mu.Lock()
			for c := range held {
				_ = c.Close()
			}
			mu.Unlock()
			readers.Wait()
		})
		// hold dials one connection and returns a channel closed when the
		// consumer closes it.
		hold := func() (<-chan struct{}, bool) {
			c, err := net.DialTimeout("tcp", tg.legitData, time.Second)
			if err != nil {
				return nil, false
			}
			mu.Lock()
			held[c] = true
			mu.Unlock()
			closed := make(chan struct{})
			readers.Add(1)
			go func() {
				defer readers.Done()
				_, _ = io.Copy(io.Discard, c)
				mu.Lock()
				delete(held, c)
				mu.Unlock()
				_ = c.Close()
				close(closed)
			}()
			return closed, true
		}
		return func(halt <-chan struct{}) {
			var wg sync.WaitGroup
			for range conns {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						closed, ok := hold()
						if !ok {
							closed = nil
						}
						select {
						case <-halt:
							return
						case <-closed:
						case <-time.After(20 * time.Millisecond):
							if ok {
								select {
								case <-halt:
									return
								case <-closed:
								}
							}
						}
					}
				}()
			}
			wg.Wait()
		}
	}}
}

// ---- item 8: sessions from a few addresses fill max_peers ---------------------------

// slotFillingAttack: four addresses (127.0.2.1-4), each opening up to the victim's
// max_peers_per_host sessions (4), one handshake at a time, and keeping them
// busy with a lookup every 500 ms. Without a secret the attacker can only
// start handshakes, so it sends its connects again each round.
func slotFillingAttack() attackDriver {
	return attackDriver{func(t *testing.T, tg attackTarget) func(<-chan struct{}) {
		const hosts, perHost = 4, 4
		a := NewAttacker(t, "127.0.2.1")
		var cs []*Conn
		acked := 0
		for h := 1; h <= hosts; h++ {
			host := fmt.Sprintf("127.0.2.%d", h)
			for range perHost {
				id := a.Listen(host)
				c := a.Dial(tg.ctl, id, host)
				cs = append(cs, c)
				c.Send(a.ConnectMsg(id))
				if tg.mode != "default" {
					continue
				}
				if _, ok := c.Await("connect", time.Second); !ok {
					continue // refused: the victim is full
				}
				c.Send(&protocol.ConnectAck{PeerID: id})
				if _, ok := c.Await("connect_ack", time.Second); ok {
					acked++
				}
			}
		}
		t.Logf("slot filling: %d of %d sessions acked", acked, len(cs))
		keepAlive := sharedLookup(1)
		return func(halt <-chan struct{}) {
			for round := 0; ; round++ {
				for _, c := range cs {
					if tg.mode != "default" {
						b, _ := protocol.Encode(a.ConnectMsg(c.Identity))
						c.trySend(b)
					}
					c.trySend(keepAlive)
				}
				until := time.Now().Add(500 * time.Millisecond)
				for time.Now().Before(until) {
					select {
					case <-halt:
						return
					default:
					}
					a.Pump(20 * time.Millisecond)
					a.Take(func(Frame) bool { return true })
				}
			}
		}
	}}
}

package hostile

import (
	"encoding/json"
	"net"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/protocol"
	"github.com/peerkv/peerkv/core/tier"
)

// tarpit is a TCP listener that counts the connections that reach it: where
// a request names a host the node must not dial.
type tarpit struct {
	ln       net.Listener
	accepted atomic.Int64
}

func newTarpit(t *testing.T, host string) *tarpit {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	require.NoError(t, err)
	p := &tarpit{ln: ln}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			p.accepted.Add(1)
			_ = c.Close()
		}
	}()
	t.Cleanup(func() { _ = ln.Close() })
	return p
}

func (p *tarpit) ID() string { return p.ln.Addr().String() }

// A client names a source outside allowed_peers in its kv_transfer_params
// (llm-d's sidecar passes them through): the node never dials it, serves
// the request locally within its deadline, counts the cause and logs it
// once per interval; a source inside the list is pulled from as before.
func TestASourceOutsideAllowedPeersIsNeverDialed(t *testing.T) {
	t.Parallel()
	pit := newTarpit(t, "127.0.2.1")
	D := OpenNode(t, map[string]any{"allowed_peers": []string{"127.0.0.0/24", "fd00::/8"}})
	P := OpenNode(t, nil)

	// Without the list the request does reach the host it names: what the
	// pit counts below is real. (The pit then counts from zero.)
	req := uniq("any")
	P.Consume(req, uniq("kv"), pit.ID())
	P.LookupAll(req, Keys("any", 1))
	within(t, 3*time.Second, func() bool { return pit.accepted.Load() > 0 }, "a node without the list never dialed the named host")
	require.NoError(t, P.FinishRequest(req))
	// P's connection to the pit lingers (and may redial) for its
	// disconnect linger: count from after it.
	time.Sleep(time.Second)
	pit.accepted.Store(0)

	keys := Keys("outside", 2)
	start := time.Now()
	for i := range 5 {
		req := uniq("out")
		if i%2 == 0 {
			D.Consume(req, uniq("kv"), pit.ID())
			assert.Equal(t, []tier.LookupResult{tier.Miss, tier.Miss}, D.LookupAll(req, keys), "served locally")
		} else {
			D.Decode(req, uniq("kv"), pit.ID())
			job := D.Load(req, keys, Range(0, 2))
			assert.False(t, D.MustJob(job, 2*time.Second).Success, "the load fails at once")
		}
		require.NoError(t, D.FinishRequest(req))
	}
	elapsed := time.Since(start)
	time.Sleep(300 * time.Millisecond) // a dial would have landed by now
	assert.Zero(t, pit.accepted.Load(), "connections that reached the host outside the list")
	assert.Less(t, elapsed, D.Cfg.LoadTimeout, "served within the deadline, not after it")
	assert.Equal(t, int64(5), D.Stats().HandshakeRejections["not_allowed"])
	assert.Equal(t, 1, strings.Count(D.Logs(), "not dialing "+pit.ID()), "one line per interval:\n%s", D.Logs())

	Pull(t, P, D) // 127.0.0.1 is inside
	assert.Equal(t, int64(5), D.Stats().HandshakeRejections["not_allowed"])
}

// A peer that dials a node from outside its list gets no session.
func TestAConnectFromOutsideAllowedPeersGetsNoSession(t *testing.T) {
	t.Parallel()
	T := OpenNode(t, map[string]any{"allowed_peers": []string{"127.0.0.1"}})
	D := OpenNode(t, nil)
	a := NewAttacker(t, "127.0.3.1")
	c := a.Dial(T.ID(), a.ID, "127.0.3.1")
	c.Send(a.ConnectMsg(a.ID))
	c.Send(&protocol.ConnectAck{PeerID: a.ID})
	_, acked := c.Await("connect_ack", time.Second)
	assert.False(t, acked, "a stranger outside the list completed a handshake")
	within(t, 3*time.Second, func() bool { return T.Stats().HandshakeRejections["not_allowed"] >= 1 },
		"the refusal is counted: %+v", T.Stats().HandshakeRejections)
	assert.Zero(t, T.Stats().SessionsOpened)
	// The control transport shuts the connection as it accepts it (the
	// tier refuses such a connect too, core/tier's test): its connect
	// never reaches the tier, and the refusal is counted all the same.
	_, ok := T.LogMatch(`closing an inbound control connection.*127\.0\.3\.1 is not an address this node admits \(allowed_peers\)`, time.Second)
	assert.True(t, ok, T.Logs())
	Pull(t, T, D)
}

// A peer inside the list cannot point the node's TCP writes outside it.
func TestADataAddressOutsideAllowedPeersIsNotDialed(t *testing.T) {
	t.Parallel()
	T := OpenNode(t, map[string]any{"allowed_peers": []string{"127.0.0.1"}})
	a := NewAttacker(t, "127.0.0.1")
	sink := newDataSink(t, "127.0.4.1")
	defer sink.Close()
	c := a.Dial(T.ID(), a.ID, "")
	m := a.ConnectMsg(a.ID)
	m.PeerKV.DataAddr = sink.Addr()
	c.Send(m)
	c.MustAwait("connect", 3*time.Second)
	c.Send(&protocol.ConnectAck{PeerID: a.ID})
	_, ok := T.LogMatch(`not dialing `+sink.Addr()+`, the TCP data address peer `+a.ID+` gave`, 3*time.Second)
	assert.True(t, ok, T.Logs())
	_, ok = T.LogMatch(`rejecting peer `+a.ID+`: data path registration failed: no data path shared`, 3*time.Second)
	assert.True(t, ok, "registered a TCP path toward a host outside the list:\n%s", T.Logs())
}

func TestABadAllowedPeersEntryIsRefusedAtConfigTime(t *testing.T) {
	fromJSON := func(list []string) error {
		o := baseOptions()
		o["port"] = 5710
		o["allowed_peers"] = list
		raw, err := json.Marshal(o)
		require.NoError(t, err)
		_, err = config.FromJSON(raw)
		return err
	}
	for _, c := range []struct {
		list []string
		want string
	}{
		{[]string{"10.0.0.0/8", "10.0.0.0/33"}, `allowed_peers[1] "10.0.0.0/33" is not a CIDR`},
		{[]string{"fd00::1/8"}, `allowed_peers[0] "fd00::1/8" has bits set past its /8: write "fd00::/8"`},
		{[]string{"10.0.0.300"}, `allowed_peers[0] "10.0.0.300" is not a CIDR, an IP address or a host name`},
		{[]string{}, `allowed_peers is empty`},
	} {
		err := fromJSON(c.list)
		require.Error(t, err, "%q", c.list)
		assert.Contains(t, err.Error(), c.want)
	}
	assert.NoError(t, fromJSON([]string{"10.0.0.0/8", "fd00::/8", "192.168.0.7", "prefill-0.svc", "*.decode.svc"}))
}

// One host with four addresses (127.0.1.2-5: one /24) fills max_peers
// (4 x max_peers_per_host) with sessions that handshook and stay; a real
// peer from another network still gets a session and pulls, and the session
// that made room for it ends with a goodbye.
func TestFourAddressesOfOneNetworkCannotKeepEverySlot(t *testing.T) {
	t.Parallel()
	const perHost, addrs = 2, 4
	T := OpenNode(t, map[string]any{"max_peers": perHost * addrs, "max_peers_per_host": perHost})
	D := OpenNode(t, nil)
	a := NewAttacker(t, "127.0.1.2")
	for i := range addrs {
		src := "127.0.1." + strconv.Itoa(2+i)
		for range perHost {
			id := a.Listen(src)
			a.Dial(T.ID(), id, src).Handshake(3 * time.Second)
		}
	}
	within(t, 3*time.Second, func() bool { return T.Stats().Sessions == perHost*addrs }, "the crowd holds every slot: %+v", T.Stats())
	time.Sleep(300 * time.Millisecond) // a session heard from within 250 ms is never evicted

	Pull(t, T, D)
	st := T.Stats()
	assert.Equal(t, int64(1), st.SessionsEvicted)
	assert.LessOrEqual(t, st.Sessions, perHost*addrs)
	_, bye := a.Await(func(f Frame) bool { return f.From == T.ID() && f.Type == "disconnect" }, 3*time.Second)
	assert.True(t, bye, "the evicted session ended with a goodbye")
}

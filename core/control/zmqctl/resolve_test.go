package zmqctl

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// stubResolver answers bind-host lookups from names, without the network,
// for the rest of the test.
func stubResolver(t *testing.T, names map[string][]net.IPAddr) {
	t.Helper()
	saved := lookupIPAddr
	lookupIPAddr = func(ctx context.Context, host string) ([]net.IPAddr, error) {
		if _, ok := ctx.Deadline(); !ok {
			t.Errorf("lookup of %q has no deadline", host)
		}
		if addrs, ok := names[host]; ok {
			return addrs, nil
		}
		return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
	}
	t.Cleanup(func() { lookupIPAddr = saved })
}

func ipAddrs(ips ...string) []net.IPAddr {
	var out []net.IPAddr
	for _, s := range ips {
		host, zone, _ := strings.Cut(s, "%")
		out = append(out, net.IPAddr{IP: net.ParseIP(host), Zone: zone})
	}
	return out
}

// newNamedTransport binds a transport whose id is "host:PORT" on a free
// port, retrying when another process grabbed the port in between.
func newNamedTransport(t *testing.T, host string) *Transport {
	t.Helper()
	for range 20 {
		port := freePort(t)
		tr, err := New(net.JoinHostPort(host, fmt.Sprint(port)), host, port, Options{Logger: quietLogger})
		if err != nil && strings.Contains(err.Error(), "in use") {
			continue
		}
		require.NoError(t, err)
		t.Cleanup(func() { _ = tr.Close() })
		return tr
	}
	t.Fatal("no free port after 20 tries")
	return nil
}

func TestBindEndpoint(t *testing.T) {
	stubResolver(t, map[string][]net.IPAddr{
		"dual.test":    ipAddrs("::1", "127.0.0.2", "127.0.0.3"),
		"v6only.test":  ipAddrs("fe80::1%lo", "::1"),
		"v6plain.test": ipAddrs("::1"),
		"empty.test":   nil,
	})
	cases := map[string]endpoint{
		// Left as they are.
		"127.0.0.1":    {addr: "tcp://127.0.0.1:5710"},
		"0.0.0.0":      {addr: "tcp://0.0.0.0:5710"},
		"*":            {addr: "tcp://*:5710"},
		"::":           {addr: "tcp://[::]:5710", ipv6: true},
		"::1":          {addr: "tcp://[::1]:5710", ipv6: true},
		"fe80::1%eth0": {addr: "tcp://[fe80::1%eth0]:5710", ipv6: true},
		// Names: the first IPv4 address, else the first IPv6 one.
		"dual.test":    {addr: "tcp://127.0.0.2:5710"},
		"v6only.test":  {addr: "tcp://[fe80::1%lo]:5710", ipv6: true},
		"v6plain.test": {addr: "tcp://[::1]:5710", ipv6: true},
	}
	if ifaces, err := net.Interfaces(); err == nil && len(ifaces) > 0 {
		// An interface name is libzmq's to resolve, as before.
		cases[ifaces[0].Name] = endpoint{addr: "tcp://" + ifaces[0].Name + ":5710"}
	}
	for host, want := range cases {
		got, err := bindEndpoint(host, 5710)
		require.NoError(t, err, host)
		assert.Equal(t, want, got, host)
	}
	for _, host := range []string{"nowhere.test", "empty.test"} {
		_, err := bindEndpoint(host, 5710)
		assert.ErrorContains(t, err, `bind host "`+host+`" did not resolve`)
	}
	_, err := bindEndpoint("10.0.0.256", 5710)
	assert.ErrorContains(t, err, `tcp://10.0.0.256:5710: bind host "10.0.0.256" is not a valid IP address`)
	_, err = bindEndpoint("", 5710)
	assert.Error(t, err)
}

// The real resolver (localhost is in /etc/hosts, no DNS involved): the
// ROUTER binds loopback while the id stays "localhost:PORT", on any libzmq.
func TestLocalhostTransportsExchangeFrames(t *testing.T) {
	// A context of the probe's own, terminated after it: pebbe's default
	// context would stay for the rest of the process, and the context tests
	// count the contexts alive (go test -count=2 runs them after this one).
	probeCtx, err := zmq.NewContext()
	require.NoError(t, err)
	probe, err := probeCtx.NewSocket(zmq.ROUTER)
	require.NoError(t, err)
	probeErr := probe.Bind(fmt.Sprintf("tcp://localhost:%d", freePort(t)))
	require.NoError(t, probe.SetLinger(0))
	require.NoError(t, probe.Close())
	require.NoError(t, probeCtx.Term())
	major, minor, patch := zmq.Version()
	t.Logf("libzmq %d.%d.%d binding tcp://localhost itself: %v", major, minor, patch, probeErr)

	a := newNamedTransport(t, "localhost")
	b := newNamedTransport(t, "localhost")
	assert.True(t, strings.HasPrefix(a.LocalID(), "localhost:"), a.LocalID())
	assert.Equal(t, fmt.Sprintf("tcp://127.0.0.1:%d", portOf(t, a.LocalID())), a.BindAddr())

	require.NoError(t, a.Send(b.LocalID(), []byte("over localhost")))
	ev := nextEvent(t, b, 5*time.Second)
	assert.Equal(t, []byte("over localhost"), ev.Frame)
	assert.Equal(t, a.LocalID(), ev.PeerID, "the id is the configured name, not the address bound")
	assert.Equal(t, "127.0.0.1", ev.Addr)
	require.NoError(t, b.Send(ev.PeerID, []byte("reply")))
	ev = nextEvent(t, a, 5*time.Second)
	assert.Equal(t, []byte("reply"), ev.Frame)
	assert.Equal(t, b.LocalID(), ev.PeerID)
}

func TestUnresolvableBindHostFailsAtNew(t *testing.T) {
	stubResolver(t, nil)
	port := freePort(t)
	tr, err := New(fmt.Sprintf("peer.invalid:%d", port), "peer.invalid", port, Options{Logger: quietLogger})
	require.Error(t, err)
	assert.Nil(t, tr)
	assert.ErrorContains(t, err, fmt.Sprintf(`tcp://peer.invalid:%d: bind host "peer.invalid" did not resolve`, port))
	assert.ErrorContains(t, err, "no such host")
}

func TestIPv6BindHosts(t *testing.T) {
	l, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	}
	require.NoError(t, l.Close())
	stubResolver(t, map[string][]net.IPAddr{"v6only.test": ipAddrs("::1")})

	literal := newNamedTransport(t, "::1")
	assert.Equal(t, fmt.Sprintf("[::1]:%d", portOf(t, literal.LocalID())), literal.LocalID())
	assert.Equal(t, fmt.Sprintf("tcp://[::1]:%d", portOf(t, literal.LocalID())), literal.BindAddr())
	named := newNamedTransport(t, "v6only.test")
	assert.Equal(t, fmt.Sprintf("tcp://[::1]:%d", portOf(t, named.LocalID())), named.BindAddr(),
		"a name with only an IPv6 address binds it, with ZMQ_IPV6")

	// Nothing dials the named side: its id is a name only the stub knows.
	require.NoError(t, named.Send(literal.LocalID(), []byte("to the v6 literal")))
	ev := nextEvent(t, literal, 5*time.Second)
	assert.Equal(t, []byte("to the v6 literal"), ev.Frame)
	assert.Equal(t, named.LocalID(), ev.PeerID)
	assert.Equal(t, "::1", ev.Addr)

	other := newNamedTransport(t, "::1")
	require.NoError(t, other.Send(literal.LocalID(), []byte("v6 to v6")))
	ev = nextEvent(t, literal, 5*time.Second)
	assert.Equal(t, other.LocalID(), ev.PeerID)
	require.NoError(t, literal.Send(ev.PeerID, []byte("v6 reply")))
	assert.Equal(t, []byte("v6 reply"), nextEvent(t, other, 5*time.Second).Frame)
}

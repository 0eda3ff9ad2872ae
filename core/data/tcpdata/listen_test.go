package tcpdata

import (
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A host name as ListenHost binds what it resolves to, as the control
// path's ROUTER does (zmqctl resolves it itself): for "localhost" the IPv4
// loopback address, which DataAddr reports, and rows flow over it.
func TestLocalhostListenHostBindsLoopback(t *testing.T) {
	localhost := func(o *Options) { o.ListenHost = "localhost" }
	src := randomRegion(t, 4)
	dst := sentinelRegion(4)
	a := newTransport(t, "localhost:1", src, localhost)
	b := newTransport(t, "localhost:2", dst, localhost)
	host, _, err := net.SplitHostPort(b.DataAddr())
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1", host)

	addPeer(t, a, "localhost:2", b)
	_, err = a.Write("localhost:2", seq(0, 4), seq(0, 4))
	require.NoError(t, err)
	require.NoError(t, nextCompletion(t, a, waitLimit).Err)
	assertRowsAt(t, src, dst, seq(0, 4), seq(0, 4))
}

package tcpdata

import (
	"net"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A listener bound to every interface advertises the host peers can dial,
// and rows still flow to it there.
func TestWildcardListenerAdvertisesTheGivenHost(t *testing.T) {
	wild := newTransport(t, "wild:1", sentinelRegion(4), func(o *Options) {
		o.ListenHost = "0.0.0.0"
		o.AdvertiseHost = "127.0.0.1"
	})
	host, port, err := net.SplitHostPort(wild.DataAddr())
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1", host)
	assert.NotEqual(t, "0", port)

	plain := newTransport(t, "plain:1", sentinelRegion(4), nil)
	assert.Equal(t, plain.listener.Addr().String(), plain.DataAddr(), "without AdvertiseHost: the bound address")
}

package zmqctl

import (
	"errors"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/control"
)

func curveKeys(t *testing.T, secret string) *CurveKeys {
	t.Helper()
	keys, err := DeriveCurveKeys(secret)
	require.NoError(t, err)
	return &keys
}

func TestDeriveCurveKeys(t *testing.T) {
	k := curveKeys(t, "cluster secret")
	again := curveKeys(t, "cluster secret")
	other := curveKeys(t, "another secret")
	assert.Equal(t, *k, *again, "every node derives the same keys")
	assert.NotEqual(t, k.ServerSecret, k.ClientSecret, "one key per role")
	assert.NotEqual(t, k.ServerSecret, other.ServerSecret)
	assert.NotEqual(t, k.ClientSecret, other.ClientSecret)
	for _, pair := range [][2]string{{k.ServerPublic, k.ServerSecret}, {k.ClientPublic, k.ClientSecret}} {
		require.Len(t, pair[0], 40)
		require.Len(t, pair[1], 40)
		public, err := zmq.AuthCurvePublic(pair[1])
		require.NoError(t, err)
		assert.Equal(t, public, pair[0], "X25519 public key must be what libzmq computes")
	}
	_, err := DeriveCurveKeys("")
	assert.Error(t, err)
}

func TestCurveOptionsAreValidated(t *testing.T) {
	k := curveKeys(t, "cluster secret")
	mismatched := *k
	mismatched.ClientPublic = k.ServerPublic
	_, err := New("127.0.0.1:5999", "127.0.0.1", 5999, Options{Curve: &mismatched, Logger: quietLogger})
	assert.ErrorContains(t, err, "client public key does not match")
	short := *k
	short.ServerSecret = "too short"
	_, err = New("127.0.0.1:5999", "127.0.0.1", 5999, Options{Curve: &short, Logger: quietLogger})
	assert.ErrorContains(t, err, "40 Z85 characters")

	saved := curveAvailable
	curveAvailable = func() bool { return false }
	defer func() { curveAvailable = saved }()
	_, err = New("127.0.0.1:5999", "127.0.0.1", 5999, Options{Curve: k, Logger: quietLogger})
	assert.ErrorIs(t, err, ErrCurveUnsupported)
}

func TestCurveTransportsExchangeFramesUnreadableOnTheWire(t *testing.T) {
	secret := "cluster secret"
	for name, curve := range map[string]*CurveKeys{"plaintext": nil, "curve": curveKeys(t, secret)} {
		t.Run(name, func(t *testing.T) {
			a := newTestTransport(t, Options{Curve: curve})
			b := newTestTransport(t, Options{Curve: curve})
			tap := newTestProxy(t, b.LocalID())
			secretFrame := []byte("kv ids and block indexes, for the peers only")

			require.NoError(t, a.Send(tap.addr, secretFrame))
			ev := nextEvent(t, b, 5*time.Second)
			assert.Equal(t, secretFrame, ev.Frame)
			assert.Equal(t, a.LocalID(), ev.PeerID)
			assert.Equal(t, "127.0.0.1", ev.Addr)
			require.NoError(t, b.Send(a.LocalID(), []byte("reply")))
			assert.Equal(t, []byte("reply"), nextEvent(t, a, 5*time.Second).Frame)

			assert.Equal(t, curve == nil, tap.saw(secretFrame), "frame visible on the wire")
			assert.Equal(t, curve == nil, tap.saw([]byte(a.LocalID())), "identity visible on the wire")
		})
	}
}

func TestCurveRouterRefusesPlaintextDealer(t *testing.T) {
	keys := curveKeys(t, "cluster secret")
	b := newTestTransport(t, Options{Curve: keys})

	raw := newRawDealer(t, "127.0.0.1:1", b.LocalID())
	_, err := raw.sock.SendBytes([]byte("plaintext"), 0)
	require.NoError(t, err)
	assert.True(t, raw.awaitEvent(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL|zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL|
		zmq.EVENT_DISCONNECTED, 5*time.Second), "the plaintext handshake must be refused")
	noEvent(t, b, 300*time.Millisecond)
	assert.Equal(t, uint64(0), b.Stats().FramesIn)

	a := newTestTransport(t, Options{Curve: keys})
	require.NoError(t, a.Send(b.LocalID(), []byte("with the secret")))
	assert.Equal(t, []byte("with the secret"), nextEvent(t, b, 5*time.Second).Frame)
}

// A peer that cannot complete the handshake is reported like an
// unreachable one, within ConnectTimeout, and nothing is delivered.
func TestCurveHandshakeFailuresReportPeerDown(t *testing.T) {
	const connectTimeout = 2 * time.Second
	cases := map[string]struct{ client, server *CurveKeys }{
		"other secret":       {curveKeys(t, "secret one"), curveKeys(t, "secret two")},
		"curve to plaintext": {curveKeys(t, "secret one"), nil},
		"plaintext to curve": {nil, curveKeys(t, "secret one")},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			a := newTestTransport(t, Options{Curve: c.client, ConnectTimeout: connectTimeout})
			b := newTestTransport(t, Options{Curve: c.server})
			start := time.Now()
			require.NoError(t, a.Send(b.LocalID(), []byte("never delivered")))
			ev := nextEvent(t, a, connectTimeout+5*time.Second)
			t.Logf("reported after %v: %v", time.Since(start), ev.Err)
			assert.Equal(t, control.EventPeerDown, ev.Kind)
			assert.Equal(t, b.LocalID(), ev.PeerID)
			assert.True(t, errors.Is(ev.Err, ErrPeerDisconnected) || errors.Is(ev.Err, ErrConnectTimeout), "err: %v", ev.Err)
			noEvent(t, b, 200*time.Millisecond)
			assert.Equal(t, uint64(0), b.Stats().FramesIn)
			assert.Equal(t, uint64(0), a.Stats().PeersUp)
		})
	}
}

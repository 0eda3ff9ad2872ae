package node

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	zmq "github.com/pebbe/zmq4"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/control/zmqctl"
	"github.com/peerkv/peerkv/core/protocol"
	"github.com/peerkv/peerkv/core/tier"
	"github.com/peerkv/peerkv/tests/hostsim"
)

// deadConsumer stands in for a consumer process at id that connected to
// the producer at target, sent its connect, and died without a FIN reaching
// the producer: its connection stays open and silent (no PONG either).
func deadConsumer(t *testing.T, target, id string, prod config.Config) {
	t.Helper()
	c, err := net.Dial("tcp", target)
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	greeting := make([]byte, 64)
	greeting[0], greeting[9], greeting[10], greeting[11] = 0xff, 0x7f, 3, 1 // ZMTP 3.1
	copy(greeting[12:], "NULL")
	_, err = c.Write(greeting)
	require.NoError(t, err)
	_, err = io.ReadFull(c, make([]byte, 64))
	require.NoError(t, err)
	property := func(name, value string) []byte {
		b := append([]byte{byte(len(name))}, name...)
		b = binary.BigEndian.AppendUint32(b, uint32(len(value)))
		return append(b, value...)
	}
	ready := append([]byte{5}, "READY"...)
	ready = append(ready, property("Socket-Type", "DEALER")...)
	ready = append(ready, property("Identity", id)...)
	connect, err := protocol.Encode(&protocol.Connect{PeerID: id, AgentMetadata: []byte{}, NumBlocks: 4, BlockLen: 4096,
		ConfigFingerprint: prod.ConfigFingerprint, HashSeed: prod.HashSeed,
		PeerKV: &protocol.Capabilities{Version: 2, Nonce: []byte{}, DataTransport: "tcp", Epoch: 1}})
	require.NoError(t, err)
	out := append([]byte{0x04, byte(len(ready))}, ready...)
	out = append(out, 0x02)
	out = binary.BigEndian.AppendUint64(out, uint64(len(connect)))
	out = append(out, connect...)
	_, err = c.Write(out)
	require.NoError(t, err)
}

// A consumer restarted on its address after a crash its producer never saw
// (plaintext, real ZMQ): the producer still holds the dead incarnation's
// connection under the consumer's id, yet the new one's pulls succeed within
// a quarter of the handshake timeout of its start, with requests every
// second meanwhile.
func TestRestartedConsumerPullsOverRealZMQ(t *testing.T) {
	prodCfg := testConfig(t, `,"data_transport":"tcp"`)
	prodRegion := testRegion()
	prod, err := Open(prodCfg, prodRegion)
	require.NoError(t, err)
	defer prod.Shutdown()

	port := freePort(t)
	id := "127.0.0.1:" + strconv.Itoa(port)
	deadConsumer(t, prod.LocalID(), id, prodCfg)
	require.Eventually(t, func() bool { return prod.Stats().SessionsOpened > 0 }, 5*time.Second, 10*time.Millisecond,
		"the dead incarnation's connect opened a session")
	time.Sleep(3 * time.Second) // the restart takes a while

	decCfg := testConfig(t, `,"data_transport":"tcp","load_timeout_s":1.5`)
	decCfg.Port = port
	bound := decCfg.HandshakeTimeout / 4
	decRegion := testRegion()
	started := time.Now()
	dec, err := Open(decCfg, decRegion)
	require.NoError(t, err)
	defer dec.Shutdown()

	took, tries := pullUntilServed(t, prod, dec, prodCfg.Port, started, 2*bound)
	t.Logf("first successful pull %v after the restarted consumer started, on try %d (bound %v)", took.Round(time.Millisecond), tries+1, bound)
	assert.Less(t, took, bound, "producer: %s\nconsumer: %s", prod.TakeLogs(1<<16), dec.TakeLogs(1<<16))
}

// pullUntilServed has dec pull one row from prod every second from started
// until a pull succeeds (or until is over), and says when and on which try.
func pullUntilServed(t *testing.T, prod, dec *tier.Tier, prodPort int, started time.Time, until time.Duration) (time.Duration, int) {
	t.Helper()
	key := make([]byte, 36)
	var tries int
	for ; time.Since(started) < until; tries++ {
		kv := fmt.Sprintf("kv-restart-%d", tries)
		copy(key, kv)
		_, err := prod.StartRequest("p"+kv, []byte(fmt.Sprintf(`{"remote_decoder":{"kv_request_id":%q}}`, kv)))
		require.NoError(t, err)
		require.NoError(t, prod.SubmitStore("p"+kv, int64(100+tries), [][]byte{key}, []int64{0}))
		require.NoError(t, prod.FinishRequest("p"+kv))
		_, err = dec.StartRequest("d"+kv, []byte(fmt.Sprintf(
			`{"remote_prefiller":{"kv_request_id":%q,"remote_host":"127.0.0.1","remote_port":%d}}`, kv, prodPort)))
		require.NoError(t, err)
		require.NoError(t, dec.SubmitLoad("d"+kv, int64(tries+1), [][]byte{key}, []int64{1}))
		res, err := hostsim.Jobs{}.Wait(dec, int64(tries+1), 10*time.Second, nil)
		require.NoError(t, err, "the load is reported")
		require.NoError(t, dec.FinishRequest("d"+kv))
		if res.Success {
			break
		}
		time.Sleep(time.Until(started.Add(time.Duration(tries+1) * time.Second)))
	}
	return time.Since(started), tries
}

// With encrypt: the consumer's old incarnation had sent its connect (its
// session at the producer waits for its proof, and the producer's own
// connection to it hangs in its handshake, as toward a host that went
// away), and the restarted consumer's connect is a new incarnation's, not
// a duplicate: its first pull succeeds.
func TestRestartedEncryptedConsumerIsServed(t *testing.T) {
	t.Setenv(config.SecretEnv, "cluster secret")
	prodCfg := testConfig(t, `,"data_transport":"tcp","encrypt":true`)
	prod, err := Open(prodCfg, testRegion())
	require.NoError(t, err)
	defer prod.Shutdown()

	// Where the old incarnation listened: accepts and never answers.
	hang, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := hang.Addr().(*net.TCPAddr).Port
	id := "127.0.0.1:" + strconv.Itoa(port)
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := hang.Accept(); err == nil {
			accepted <- c
		}
	}()
	keys, err := zmqctl.DeriveCurveKeys("cluster secret")
	require.NoError(t, err)
	ctx, err := zmq.NewContext()
	require.NoError(t, err)
	old, err := ctx.NewSocket(zmq.DEALER)
	require.NoError(t, err)
	for _, set := range []func() error{
		func() error { return old.SetIdentity(id) },
		func() error { return old.SetLinger(0) },
		func() error { return old.SetCurveServerkey(keys.ServerPublic) },
		func() error { return old.SetCurvePublickey(keys.ClientPublic) },
		func() error { return old.SetCurveSecretkey(keys.ClientSecret) },
	} {
		require.NoError(t, set())
	}
	defer func() { old.Close(); _ = ctx.Term() }()
	require.NoError(t, old.Connect("tcp://"+prod.LocalID()))
	connect, err := protocol.Encode(&protocol.Connect{PeerID: id, AgentMetadata: []byte{}, NumBlocks: 1, BlockLen: 4096,
		ConfigFingerprint: prodCfg.ConfigFingerprint, HashSeed: prodCfg.HashSeed,
		PeerKV: &protocol.Capabilities{Version: 2, Nonce: make([]byte, 16), Epoch: 1}})
	require.NoError(t, err)
	_, err = old.SendBytes(connect, 0)
	require.NoError(t, err)
	var held net.Conn
	select {
	case held = <-accepted: // the producer dialed back: its session is open
	case <-time.After(5 * time.Second):
		t.Fatal("the producer never dialed the old incarnation back")
	}
	defer held.Close()
	require.NoError(t, hang.Close()) // the port is free again; the producer's connection stays open

	decCfg := testConfig(t, `,"data_transport":"tcp","encrypt":true,"load_timeout_s":1.5`)
	decCfg.Port = port
	bound := decCfg.HandshakeTimeout / 4
	started := time.Now()
	dec, err := Open(decCfg, testRegion())
	require.NoError(t, err)
	defer dec.Shutdown()
	took, tries := pullUntilServed(t, prod, dec, prodCfg.Port, started, 2*bound)
	t.Logf("first successful pull %v after the restarted consumer started, on try %d (bound %v)", took.Round(time.Millisecond), tries+1, bound)
	assert.Zero(t, tries, "the first pull failed; producer: %s", prod.TakeLogs(1<<16))
	assert.Less(t, took, bound)
}

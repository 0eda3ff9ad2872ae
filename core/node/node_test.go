package node

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	zmq "github.com/pebbe/zmq4"
	"golang.org/x/sys/unix"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/tier"
	"github.com/peerkv/peerkv/tests/hostsim"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// freePort returns a loopback port free right now, below the kernel's
// ephemeral range, where no outgoing connection of a test running beside
// this one can take it before the node binds it.
func freePort(t *testing.T) int {
	t.Helper()
	for range 500 {
		p := 20000 + rand.IntN(12000)
		if ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p)); err == nil {
			_ = ln.Close()
			return p
		}
	}
	t.Fatal("no free port below the ephemeral range")
	return 0
}

func testConfig(t *testing.T, extra string) config.Config {
	t.Helper()
	cfg, err := config.FromJSON([]byte(`{"host":"127.0.0.1","port":` + strconv.Itoa(freePort(t)) +
		`,"data_port":0,"shutdown_drain_timeout_s":0.5` + extra + `}`))
	require.NoError(t, err)
	return cfg
}

func testRegion() data.Region { return data.Region{Mem: make([]byte, 4*4096), RowLen: 4096} }

// sharedRegion is file-backed, as vLLM's is, so the same-host path can
// hand it to a local peer.
func sharedRegion(t *testing.T) data.Region {
	fd, err := unix.MemfdCreate("peerkv-node-test", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	const size = 4 * 4096
	require.NoError(t, unix.Ftruncate(fd, size))
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(mem); _ = unix.Close(fd) })
	return data.Region{Mem: mem, RowLen: 4096}
}

func TestOpenBindsTheControlPortAndShutsDown(t *testing.T) {
	cfg := testConfig(t, "")
	tr, err := Open(cfg, testRegion())
	require.NoError(t, err)
	assert.Equal(t, cfg.LocalID(), tr.LocalID())

	_, err = Open(cfg, testRegion())
	require.ErrorIs(t, err, ErrTransport, "a second peer on the same port must fail to bind")
	assert.Contains(t, err.Error(), cfg.LocalID())

	done := make(chan error, 1)
	go func() { done <- tr.Shutdown() }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Shutdown did not return within 10s")
	}
	// The port is free again.
	tr, err = Open(cfg, testRegion())
	require.NoError(t, err)
	require.NoError(t, tr.Shutdown())
}

func TestNixlThatCannotLoadIsUnavailableAndReleasesThePort(t *testing.T) {
	cfg := testConfig(t, `,"data_transport":"nixl","nixl_library":"/nonexistent/libnixl_capi.so"`)
	_, err := Open(cfg, testRegion())
	require.ErrorIs(t, err, ErrUnavailable)
	assert.Contains(t, err.Error(), "NIXL unavailable")

	cfg.DataTransport = "tcp"
	tr, err := Open(cfg, testRegion())
	require.NoError(t, err, "the failed open must have closed its control socket")
	require.NoError(t, tr.Shutdown())
}

func TestDataPortInUseIsATransportError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	cfg := testConfig(t, `,"data_host":"127.0.0.1","data_port":`+strconv.Itoa(ln.Addr().(*net.TCPAddr).Port))
	_, err = Open(cfg, testRegion())
	require.ErrorIs(t, err, ErrTransport)
	assert.Contains(t, err.Error(), "data path")
	// The option to change is named, with the port.
	assert.Contains(t, err.Error(), fmt.Sprintf("data_port %d is in use", ln.Addr().(*net.TCPAddr).Port))
	assert.Contains(t, err.Error(), "set data_port to a free port")
}

func TestInvalidConfigIsAnInvalidArgument(t *testing.T) {
	cfg := testConfig(t, "")
	cfg.DataTransport = "carrier-pigeon"
	_, err := Open(cfg, testRegion())
	require.ErrorIs(t, err, tier.ErrInvalidArgument)
	assert.Contains(t, err.Error(), "carrier-pigeon")
}

func TestNixlStatusIsOKOrSaysWhy(t *testing.T) {
	s := NixlStatus()
	assert.NotEmpty(t, s)
	if s != "ok" {
		assert.Contains(t, s, "NIXL unavailable")
	}
}

func TestAutoWithoutNixlServesTCPAndSaysWhy(t *testing.T) {
	cfg := testConfig(t, `,"nixl_library":"/nonexistent/libnixl_capi.so"`)
	require.Equal(t, config.DataAuto, cfg.DataTransport, "auto is the default")
	tr, err := Open(cfg, sharedRegion(t))
	require.NoError(t, err, "auto must not fail when NIXL is missing")
	defer tr.Shutdown()
	assert.Equal(t, "shm+tcp", tr.Stats().DataPaths)
	logs := string(tr.TakeLogs(1 << 16))
	assert.Contains(t, logs, "stock vLLM peers cannot be served")
	assert.Contains(t, logs, "NIXL unavailable")
	assert.Contains(t, logs, "/nonexistent/libnixl_capi.so", "the log names what was tried")
}

func TestAutoWithAuthSecretLeavesNixlOff(t *testing.T) {
	cfg := testConfig(t, `,"auth_secret":"s3cret"`)
	tr, err := Open(cfg, sharedRegion(t))
	require.NoError(t, err)
	defer tr.Shutdown()
	assert.Equal(t, "shm+tcp", tr.Stats().DataPaths, "the same-host grant is kernel-checked and bound to one peer, so it stays")
	assert.Contains(t, string(tr.TakeLogs(1<<16)), "NIXL is off because auth_secret is set")
}

func TestTCPOnlyNeverLoadsNixl(t *testing.T) {
	cfg := testConfig(t, `,"data_transport":"tcp"`)
	tr, err := Open(cfg, testRegion())
	require.NoError(t, err)
	defer tr.Shutdown()
	assert.Equal(t, "tcp", tr.Stats().DataPaths)
	assert.NotContains(t, string(tr.TakeLogs(1<<16)), "NIXL")
}

func TestControlTransportWarningsReachTheHostLog(t *testing.T) {
	cfg := testConfig(t, `,"data_transport":"tcp"`)
	tr, err := Open(cfg, testRegion())
	require.NoError(t, err)
	defer tr.Shutdown()

	ctx, err := zmq.NewContext()
	require.NoError(t, err)
	defer ctx.Term()
	sock, err := ctx.NewSocket(zmq.DEALER)
	require.NoError(t, err)
	defer sock.Close()
	require.NoError(t, sock.SetLinger(0))
	require.NoError(t, sock.Connect("tcp://"+cfg.LocalID()))
	_, err = sock.SendMessage("two", "frames") // vLLM's wire is one frame per message
	require.NoError(t, err)

	var logs string
	require.Eventually(t, func() bool {
		logs += string(tr.TakeLogs(1 << 16))
		return strings.Contains(logs, "wrong frame count")
	}, 5*time.Second, 10*time.Millisecond)
	assert.Contains(t, logs, "WARNING control transport: level=WARN")
}

func TestSameHostCopyCanBeTurnedOff(t *testing.T) {
	cfg := testConfig(t, `,"same_host_copy":false,"nixl_library":"/nonexistent/libnixl_capi.so"`)
	tr, err := Open(cfg, testRegion())
	require.NoError(t, err)
	defer tr.Shutdown()
	assert.Equal(t, "tcp", tr.Stats().DataPaths)
}

// The documented default host, spelled out or left out, binds on any libzmq
// (4.3.4 does not resolve names on bind itself) and stays the identity.
func TestLocalhostIsTheDefaultHostAndBinds(t *testing.T) {
	for name, host := range map[string]string{"localhost": `"host":"localhost",`, "no host": ""} {
		t.Run(name, func(t *testing.T) {
			port := freePort(t)
			cfg, err := config.FromJSON([]byte(`{` + host + `"port":` + strconv.Itoa(port) +
				`,"data_port":0,"data_transport":"tcp","shutdown_drain_timeout_s":0.5}`))
			require.NoError(t, err)
			tr, err := Open(cfg, testRegion())
			require.NoError(t, err)
			assert.Equal(t, "localhost:"+strconv.Itoa(port), tr.LocalID())
			conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), 5*time.Second)
			require.NoError(t, err, "the control port is bound on loopback")
			_ = conn.Close()

			done := make(chan error, 1)
			go func() { done <- tr.Shutdown() }()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Fatal("Shutdown did not return within 10s")
			}
		})
	}
}

// pullOnce runs one PD transfer of one row from prod to dec, within bounds.
func pullOnce(t *testing.T, prod, dec *tier.Tier, prodRegion, decRegion data.Region, kv string) {
	t.Helper()
	key := make([]byte, 36)
	copy(key, kv)
	row := prodRegion.Row(0)
	for i := range row {
		row[i] = byte(i*7 + len(kv))
	}
	_, err := prod.StartRequest("p", []byte(fmt.Sprintf(`{"remote_decoder":{"kv_request_id":%q}}`, kv)))
	require.NoError(t, err)
	require.NoError(t, prod.SubmitStore("p", 1, [][]byte{key}, []int64{0}))
	_, err = dec.StartRequest("d", []byte(fmt.Sprintf(
		`{"remote_prefiller":{"kv_request_id":%q,"remote_host":"127.0.0.1","remote_port":%s}}`,
		kv, strings.TrimPrefix(prod.LocalID(), "127.0.0.1:"))))
	require.NoError(t, err)
	require.NoError(t, dec.SubmitLoad("d", 2, [][]byte{key}, []int64{1}))
	res, err := hostsim.Jobs{}.Wait(dec, 2, 15*time.Second, nil)
	require.NoError(t, err)
	require.True(t, res.Success, "logs: %s", dec.TakeLogs(1<<16))
	assert.Equal(t, row, decRegion.Row(1))
}

// Two nodes with a secret and encrypt: CURVE on the control path, TLS on
// the TCP data path, and the pull works end to end.
func TestEncryptedNodesPullEndToEnd(t *testing.T) {
	t.Setenv(config.SecretEnv, "cluster secret")
	prodCfg := testConfig(t, `,"data_transport":"tcp","encrypt":true`)
	decCfg := testConfig(t, `,"data_transport":"tcp","encrypt":true`)
	prodRegion, decRegion := testRegion(), testRegion()
	prod, err := Open(prodCfg, prodRegion)
	require.NoError(t, err)
	defer prod.Shutdown()
	dec, err := Open(decCfg, decRegion)
	require.NoError(t, err)
	defer dec.Shutdown()
	pullOnce(t, prod, dec, prodRegion, decRegion, "kv-encrypted")
}

// A node without encrypt cannot talk to one with it, and says nothing
// useful to it: the load fails within its deadline instead of hanging.
func TestEncryptedAndPlainNodesDoNotTalk(t *testing.T) {
	t.Setenv(config.SecretEnv, "cluster secret")
	prodCfg := testConfig(t, `,"data_transport":"tcp","encrypt":true`)
	decCfg := testConfig(t, `,"data_transport":"tcp","handshake_timeout_s":1,"load_timeout_s":1,"abort_ack_timeout_s":0.5`)
	prod, err := Open(prodCfg, testRegion())
	require.NoError(t, err)
	defer prod.Shutdown()
	dec, err := Open(decCfg, testRegion())
	require.NoError(t, err)
	defer dec.Shutdown()
	_, err = dec.StartRequest("d", []byte(fmt.Sprintf(
		`{"remote_prefiller":{"kv_request_id":"kv-x","remote_host":"127.0.0.1","remote_port":%d}}`, prodCfg.Port)))
	require.NoError(t, err)
	require.NoError(t, dec.SubmitLoad("d", 1, [][]byte{make([]byte, 36)}, []int64{0}))
	res, err := hostsim.Jobs{}.Wait(dec, 1, 10*time.Second, nil)
	require.NoError(t, err)
	assert.False(t, res.Success)
	assert.Zero(t, prod.Stats().DataPeers, "the plaintext peer never got past CURVE")
}

// A firewall is written before the node starts: with no data_port, the TCP
// data listener is on the control port + 1000, not an ephemeral port.
func TestTheDefaultDataPortIsTheControlPortPlus1000(t *testing.T) {
	for range 50 {
		port := freePort(t)
		ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+1000))
		if err != nil {
			continue // port + 1000 is someone else's: pick another pair
		}
		_ = ln.Close()
		cfg, err := config.FromJSON([]byte(`{"host":"127.0.0.1","port":` + strconv.Itoa(port) +
			`,"data_transport":"tcp","shutdown_drain_timeout_s":0.5}`))
		require.NoError(t, err)
		tr, err := Open(cfg, testRegion())
		if errors.Is(err, ErrTransport) {
			continue // one of the pair was taken meanwhile
		}
		require.NoError(t, err)
		defer tr.Shutdown()
		conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port+1000), 5*time.Second)
		require.NoError(t, err, "nothing listens on port + 1000, the data port a firewall was told")
		_ = conn.Close()
		return
	}
	t.Fatal("no free pair of ports (port, port + 1000) in 50 tries")
}

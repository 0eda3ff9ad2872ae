package hostile

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// patchedLibzmqEnv names the patched libzmq.so.5 the Makefile's test
// targets run with (first on LD_LIBRARY_PATH); see security.md D11.
const patchedLibzmqEnv = "PEERKV_PATCHED_LIBZMQ"

// D11: libzmq 4.3.4 aborts the process when a connection fails while its
// input is stopped and a PING is then written to it. A stranger arranges it
// with raw ZMTP: it dials under an identity in use (the node's ROUTER never
// reads that second connection, so its input stops once it is full), sends
// a PING and resets the connection; the heartbeat or the PONG then writes to
// the failed connection. The node runs in a process of its own (a victim),
// so the abort the system's libzmq5 dies of is reported here rather than
// ending the test binary. Under the patched libzmq (`make test-go`) the node
// lives on, and the libzmq it mapped is that one.
func TestStrangerResettingAFullDuplicateConnectionDoesNotAbortTheNode(t *testing.T) {
	want := patchedLibzmq(t)
	v := startVictim(t, victimSpec{Rows: NumRows, Served: uniq("d11-served")})
	loaded, err := v.ask("libzmq")
	if err != nil {
		t.Fatalf("victim: %v", err)
	}

	identity := uniq("d11-stranger")
	stop := make(chan struct{})
	var talking sync.WaitGroup
	talking.Add(1)
	talker := dialZMTP(t, v.ID, identity)
	go func() { defer talking.Done(); keepTalking(talker, stop) }()
	t.Cleanup(func() { close(stop); talking.Wait() })
	time.Sleep(500 * time.Millisecond) // the talker's connection is the identity's first

	dup := dialZMTP(t, v.ID, identity)
	full := make([]byte, 0, 64*(4096+9))
	for range 64 { // far past the two frames the ROUTER takes in before it stops reading
		full = append(full, zmtpMessage(slices.Repeat([]byte{0x80}, 4096))...)
	}
	ping := []byte{0x04, 7, 4, 'P', 'I', 'N', 'G', 0, 0} // a command: "PING", TTL 0, no context
	_ = dup.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := dup.Write(append(full, ping...)); err != nil {
		t.Fatalf("fill the duplicate connection: %v", err)
	}
	time.Sleep(500 * time.Millisecond)
	_ = dup.SetLinger(0)
	_ = dup.Close() // a reset, not a FIN

	// Unpatched, the node dies at its next heartbeat (5 s) or on the PONG:
	// it must outlive two heartbeat intervals.
	var st victimStat
	for deadline := time.Now().Add(12 * time.Second); time.Now().Before(deadline); time.Sleep(250 * time.Millisecond) {
		if st, err = v.stat(); err != nil {
			t.Fatalf("the node's process died of a stranger's reset (%v); it ran on libzmq %q, not the patched %s "+
				"(security.md D11: `make test-go` runs the tests with it). Its stderr ended with:\n%s",
				err, loaded, want, tail(v.stderr.String()))
		}
	}
	if st.FramesIn == 0 {
		t.Fatalf("no frame of the stranger reached the node: the attack did not happen (%v)", st)
	}
	requireLoaded(t, "the node's process", strings.Fields(loaded), want)
	requireLoaded(t, "the test process", loadedLibzmq(), want)
}

// patchedLibzmq returns the patched library's real path, failing the test
// (saying how to get it) where it is not named or not built.
func patchedLibzmq(t *testing.T) string {
	t.Helper()
	path := os.Getenv(patchedLibzmqEnv)
	if path == "" {
		t.Fatalf("%s is not set: this test needs the patched libzmq (security.md D11). `make test-go` builds it "+
			"and runs the tests with it; by hand, eval \"$(make -s libzmq-dev-env)\" first", patchedLibzmqEnv)
	}
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		t.Fatalf("%s=%s: %v; build it with `make libzmq-dev`", patchedLibzmqEnv, path, err)
	}
	return real
}

// requireLoaded fails unless the libzmq files mapped (loaded) are exactly want.
func requireLoaded(t *testing.T, who string, loaded []string, want string) {
	t.Helper()
	if len(loaded) != 1 || loaded[0] != want {
		t.Fatalf("%s mapped libzmq %q, not the patched %s: is %s's directory first on LD_LIBRARY_PATH? "+
			"(`make test-go` puts it there)", who, loaded, want, patchedLibzmqEnv)
	}
}

// loadedLibzmq lists the libzmq files this process has mapped (from
// /proc/self/maps), by their real paths.
func loadedLibzmq() []string {
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return []string{"(/proc/self/maps: " + err.Error() + ")"}
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 6 || !strings.HasPrefix(filepath.Base(fields[5]), "libzmq") {
			continue
		}
		path := fields[5]
		if real, err := filepath.EvalSymlinks(path); err == nil {
			path = real
		}
		if !slices.Contains(out, path) {
			out = append(out, path)
		}
	}
	return out
}

// ---- raw ZMTP 3.1 (NULL mechanism), as a stranger's own code speaks it ----

// dialZMTP connects to target as a DEALER claiming identity and returns once
// the node's READY arrived (frames sent earlier would fail the handshake).
func dialZMTP(t *testing.T, target, identity string) *net.TCPConn {
	t.Helper()
	c, err := net.DialTimeout("tcp", target, 5*time.Second)
	if err != nil {
		t.Fatalf("dial %s: %v", target, err)
	}
	conn := c.(*net.TCPConn)
	greeting := make([]byte, 64)
	greeting[0], greeting[9], greeting[10], greeting[11] = 0xff, 0x7f, 3, 1
	copy(greeting[12:], "NULL")
	ready := append([]byte{5}, "READY"...)
	ready = append(ready, zmtpProperty("Socket-Type", "DEALER")...)
	ready = append(ready, zmtpProperty("Identity", identity)...)
	_ = conn.SetDeadline(time.Now().Add(5 * time.Second))
	defer func() { _ = conn.SetDeadline(time.Time{}) }()
	if _, err := conn.Write(append(greeting, append([]byte{0x04, byte(len(ready))}, ready...)...)); err != nil {
		t.Fatalf("handshake with %s: %v", target, err)
	}
	theirs := make([]byte, 64+2)
	if _, err := io.ReadFull(conn, theirs); err != nil {
		t.Fatalf("the node's greeting: %v", err)
	}
	if flags := theirs[64]; flags != 0x04 {
		t.Fatalf("expected the node's READY command, got flags %#x", flags)
	}
	if _, err := io.ReadFull(conn, make([]byte, theirs[65])); err != nil {
		t.Fatalf("the node's READY: %v", err)
	}
	return conn
}

func zmtpProperty(name, value string) []byte {
	out := append([]byte{byte(len(name))}, name...)
	out = binary.BigEndian.AppendUint32(out, uint32(len(value)))
	return append(out, value...)
}

// zmtpMessage is one final message frame holding body.
func zmtpMessage(body []byte) []byte {
	if len(body) < 256 {
		return append([]byte{0x00, byte(len(body))}, body...)
	}
	return append(binary.BigEndian.AppendUint64([]byte{0x02}, uint64(len(body))), body...)
}

// keepTalking holds the identity's first connection (conn) and sends on it every
// 50 ms (an empty msgpack map: dropped, no session), so it stays the live
// one and the second stays a never-read duplicate.
func keepTalking(conn *net.TCPConn, stop <-chan struct{}) {
	defer conn.Close()
	for {
		_ = conn.SetWriteDeadline(time.Now().Add(time.Second))
		if _, err := conn.Write(zmtpMessage([]byte{0x80})); err != nil {
			fmt.Fprintf(os.Stderr, "d11 talker: %v\n", err) // the node may drop it; the test judges by the node
			return
		}
		select {
		case <-stop:
			return
		case <-time.After(50 * time.Millisecond):
		}
	}
}

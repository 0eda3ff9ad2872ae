package zmqctl

import (
	"bufio"
	"context"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/control"
)

// oraclePython returns a python with pyzmq (the library vLLM uses), or
// skips the test; PEERKV_REQUIRE_ORACLE=1 turns the skip into a failure.
func oraclePython(t *testing.T) string {
	t.Helper()
	python := os.Getenv("PEERKV_PYTHON")
	if python == "" {
		python = "../../../.venv/bin/python" // the repository's venv; tests run in the package directory
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, python, "-c", "import zmq; print(zmq.zmq_version())").CombinedOutput()
	if err != nil {
		msg := fmt.Sprintf("pyzmq oracle unavailable (%s: %v: %s); set PEERKV_PYTHON", python, err, strings.TrimSpace(string(out)))
		if os.Getenv("PEERKV_REQUIRE_ORACLE") == "1" {
			t.Fatal(msg)
		}
		t.Skip(msg)
	}
	t.Logf("pyzmq oracle %s with libzmq %s", python, strings.TrimSpace(string(out)))
	return python
}

// startPythonPeer runs testdata/vllm_style_peer.py and waits for READY.
func startPythonPeer(t *testing.T, python, goPeerID string) (peerID string, lines <-chan string) {
	t.Helper()
	for range 10 {
		port := freePort(t)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		cmd := exec.CommandContext(ctx, python, "testdata/vllm_style_peer.py", "127.0.0.1", fmt.Sprint(port), goPeerID)
		cmd.Stderr = os.Stderr
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		out := make(chan string, 16)
		go func() {
			defer close(out)
			scanner := bufio.NewScanner(stdout)
			for scanner.Scan() {
				out <- scanner.Text()
			}
		}()
		first, ok := <-out
		if ok && first == "READY" {
			t.Cleanup(func() {
				_ = cmd.Wait()
				cancel()
			})
			return fmt.Sprintf("127.0.0.1:%d", port), out
		}
		cancel()
		_ = cmd.Wait()
		require.True(t, strings.HasPrefix(first, "BINDFAIL"), "python peer: %q", first)
	}
	t.Fatal("python peer could not bind a loopback port")
	return "", nil
}

func TestInteropWithVLLMStylePyzmqPeer(t *testing.T) {
	python := oraclePython(t)
	us := newTestTransport(t, Options{})
	pyID, pyOut := startPythonPeer(t, python, us.LocalID())

	ev := nextEvent(t, us, 10*time.Second)
	require.Equal(t, control.EventFrame, ev.Kind)
	assert.Equal(t, pyID, ev.PeerID, "python's identity must be its host:port")
	assert.Equal(t, []byte("hello from python"), ev.Frame)

	// Binary payloads, including an empty frame, survive both ways.
	payloads := [][]byte{{0x82, 0xa4, 't', 'y', 'p', 'e', 0xc4, 0x00, 0x00, 0xff}, {}}
	for _, p := range payloads {
		require.NoError(t, us.Send(pyID, p))
		line := readLine(t, pyOut, 10*time.Second)
		assert.Equal(t, fmt.Sprintf("FROM %s %s", us.LocalID(), hex.EncodeToString(p)), line)
		ev := nextEvent(t, us, 10*time.Second)
		assert.Equal(t, pyID, ev.PeerID)
		assert.Equal(t, append([]byte("echo:"), p...), ev.Frame)
	}

	// The python peer exits (sockets closed): our DEALER to it goes down.
	ev = nextEvent(t, us, 10*time.Second)
	assert.Equal(t, control.EventPeerDown, ev.Kind)
	assert.Equal(t, pyID, ev.PeerID)
}

func readLine(t *testing.T, lines <-chan string, timeout time.Duration) string {
	t.Helper()
	select {
	case line, ok := <-lines:
		require.True(t, ok, "python peer exited early")
		return line
	case <-time.After(timeout):
		t.Fatalf("python peer silent for %v", timeout)
		return ""
	}
}

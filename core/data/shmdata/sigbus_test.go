package shmdata

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// A host that installs its own SIGBUS handler after our runtime started
// (Python's faulthandler, enabled by vLLM's watchdog after the library
// loaded) leaves Go no say over a fault: the kernel copies then. Left to
// Go's handler, the fast copy runs and recovers a fault. Either way, a file
// that shrinks under a copy, the consumer's or our own, must fail that
// transfer and nothing more.
func TestAFileShrinkingUnderACopyFailsTheTransferWhateverHandlerTheHostInstalled(t *testing.T) {
	const rows, rowLen = 16, 64 << 10 // as runForeignHandlerProducer's
	self, err := os.Executable()
	require.NoError(t, err)
	start := func(t *testing.T, handler, shrunk, offer string) (*exec.Cmd, io.WriteCloser, *bufio.Scanner, *bytes.Buffer) {
		cmd := exec.Command(self, "-test.run=^$")
		cmd.Env = childEnviron(foreignEnv + "=" + handler + " " + shrunk + " " + offer)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		stdin, err := cmd.StdinPipe()
		require.NoError(t, err)
		stdout, err := cmd.StdoutPipe()
		require.NoError(t, err)
		require.NoError(t, cmd.Start())
		proc := cmd.Process
		bound := time.AfterFunc(30*time.Second, func() { _ = proc.Kill() })
		t.Cleanup(func() { bound.Stop() })
		return cmd, stdin, bufio.NewScanner(stdout), &stderr
	}
	for _, c := range []struct{ handler, path string }{{"foreign", "path kernel"}, {"go", "path mapped"}} {
		t.Run(c.handler+" handler: the consumer shrinks its file", func(t *testing.T) {
			cons, _, fd := consumerRegionFd(t, rows, rowLen, 0, nil)
			cmd, stdin, stdout, stderr := start(t, c.handler, "destination", cons.Offer(prodID))
			var said []string
			for stdout.Scan() {
				if stdout.Text() == "shrink" { // one row copied, the rest to come
					require.NoError(t, unix.Ftruncate(fd, 0))
					_, _ = io.WriteString(stdin, "go\n")
					continue
				}
				said = append(said, stdout.Text())
			}
			require.NoError(t, cmd.Wait(), "the producer process died: %q %s", said, stderr)
			require.Len(t, said, 2)
			assert.Equal(t, c.path, said[0])
			assert.True(t, strings.HasPrefix(said[1], "failed:"), "the transfer is reported failed: %q", said[1])
			assert.Contains(t, said[1], "shrank")
		})
		t.Run(c.handler+" handler: our own region file shrinks", func(t *testing.T) {
			cons, _, _ := consumerRegionFd(t, rows, rowLen, 0, nil)
			cmd, _, stdout, stderr := start(t, c.handler, "source", cons.Offer(prodID))
			var said []string
			for stdout.Scan() {
				said = append(said, stdout.Text())
			}
			require.NoError(t, cmd.Wait(), "the producer process died: %q %s", said, stderr)
			require.Len(t, said, 2)
			assert.Equal(t, c.path, said[0])
			assert.True(t, strings.HasPrefix(said[1], "failed:"), "the transfer is reported failed: %q", said[1])
			assert.Contains(t, said[1], "our region file shrank")
		})
	}
}

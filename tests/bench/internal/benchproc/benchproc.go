// Package benchproc holds what the benchmarks under tests/bench share: a
// host-like region (a memfd mapped shared, as vLLM's /dev/shm region is) and
// the benchmark re-executed as a child process driven over its stdin and
// stdout, every wait on it bounded.
package benchproc

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"time"

	"golang.org/x/sys/unix"

	"github.com/peerkv/peerkv/core/data"
)

// Region maps rows*rowLen bytes outside the Go heap, as a host's region is
// (NIXL registers it): a memfd mapped MAP_SHARED, so the same-host path can
// grant it. The fd stays open for the process's life.
func Region(name string, rows int, rowLen uint64) (data.Region, error) {
	size := rows * int(rowLen)
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return data.Region{}, fmt.Errorf("memfd_create: %w", err)
	}
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return data.Region{}, fmt.Errorf("ftruncate: %w", err)
	}
	mem, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return data.Region{}, fmt.Errorf("mmap: %w", err)
	}
	return data.Region{Mem: mem, RowLen: rowLen}, nil
}

// Child is this program re-executed with extra environment, driven over its
// stdin and stdout; its stderr is ours.
type Child struct {
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	lines   chan string
	timeout time.Duration
}

// Start re-executes this program with its arguments and env added to ours.
// timeout bounds every later wait on the child.
func Start(timeout time.Duration, env ...string) (*Child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	c := &Child{cmd: cmd, stdin: stdin, lines: make(chan string, 4), timeout: timeout}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	return c, nil
}

// ReadLine returns the child's next line of output.
func (c *Child) ReadLine() (string, error) {
	select {
	case line, ok := <-c.lines:
		if !ok {
			return "", fmt.Errorf("child exited early")
		}
		return line, nil
	case <-time.After(c.timeout):
		return "", fmt.Errorf("child silent for %v", c.timeout)
	}
}

// Println sends the child one line on its stdin.
func (c *Child) Println(line string) error {
	_, err := fmt.Fprintln(c.stdin, line)
	return err
}

// Stop closes the child's stdin and waits for it, killing it if it hangs.
// It is idempotent.
func (c *Child) Stop() {
	_ = c.stdin.Close()
	if c.cmd.ProcessState != nil {
		return
	}
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(c.timeout):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

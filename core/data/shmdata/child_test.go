package shmdata

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/tests/foreignsig"
	"github.com/peerkv/peerkv/tests/noptrace"
)

// The consumer of most tests is another process: this test binary
// re-executed with childEnv = "<local id> <rows> <row len> <skip>".
const childEnv = "PEERKV_SHMDATA_TEST_CHILD"

// A producer child: this test binary re-executed with producerEnv =
// "<local id> <rows> <row len> <consumer id> <offer>" (runProducerChild).
const producerEnv = "PEERKV_SHMDATA_TEST_PRODUCER"

// A raw claimant: this test binary re-executed with rawClaimEnv =
// "<local id> <offer>" (runRawClaim).
const rawClaimEnv = "PEERKV_SHMDATA_TEST_RAW_CLAIM"

// A producer under a host's own SIGBUS handler: this test binary
// re-executed with foreignEnv = "<source|destination> <offer>"
// (runForeignHandlerProducer).
const foreignEnv = "PEERKV_SHMDATA_TEST_FOREIGN_SIGBUS"

func TestMain(m *testing.M) {
	if spec := os.Getenv(childEnv); spec != "" {
		os.Exit(runChild(spec))
	}
	if spec := os.Getenv(producerEnv); spec != "" {
		os.Exit(runProducerChild(spec))
	}
	if spec := os.Getenv(rawClaimEnv); spec != "" {
		os.Exit(runRawClaim(spec))
	}
	if spec := os.Getenv(foreignEnv); spec != "" {
		os.Exit(runForeignHandlerProducer(spec))
	}
	os.Exit(m.Run())
}

// memfdRegionFlags maps a fresh memfd made with flags MAP_SHARED, whole, as
// a region, and returns the fd, which stays open.
func memfdRegionFlags(rows, rowLen, flags int) (data.Region, int, error) {
	fd, err := unix.MemfdCreate("peerkv-shmdata-test", unix.MFD_CLOEXEC|flags)
	if err != nil {
		return data.Region{}, -1, err
	}
	if err := unix.Ftruncate(fd, int64(rows*rowLen)); err != nil {
		return data.Region{}, -1, err
	}
	mem, err := unix.Mmap(fd, 0, rows*rowLen, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return data.Region{}, -1, err
	}
	return data.Region{Mem: mem, RowLen: uint64(rowLen)}, fd, nil
}

// memfdRegion maps a fresh memfd MAP_SHARED, as a host's region would be;
// the region starts skip bytes into the file. It returns the whole mapping
// too and the fd, which stays open.
func memfdRegion(rows, rowLen, skip int) (data.Region, []byte, int, error) {
	fd, err := unix.MemfdCreate("peerkv-shmdata-test", unix.MFD_CLOEXEC)
	if err != nil {
		return data.Region{}, nil, -1, err
	}
	size := skip + rows*rowLen
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return data.Region{}, nil, -1, err
	}
	all, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return data.Region{}, nil, -1, err
	}
	return data.Region{Mem: all[skip:], RowLen: uint64(rowLen)}, all, fd, nil
}

// runChild serves its region and answers one line per command on stdin:
// "offer PEER", "withdraw PEER OFFER", "sum" (sha256 of the whole file),
// "truncate" (shrink the file to nothing), "resize BYTES" (set the file's
// size), "claim ROWS FILESIZE" (every later grant says so, whatever the
// region and file hold), "logs" (refusals logged).
func runChild(spec string) int {
	var id string
	var rows, rowLen, skip int
	if _, err := fmt.Sscanf(spec, "%s %d %d %d", &id, &rows, &rowLen, &skip); err != nil {
		fmt.Fprintln(os.Stderr, "child spec:", err)
		return 2
	}
	region, all, fd, err := memfdRegion(rows, rowLen, skip)
	if err != nil {
		fmt.Fprintln(os.Stderr, "child region:", err)
		return 2
	}
	var mu sync.Mutex
	var logs []string
	tr, err := New(Options{Region: region, LocalID: id, Logf: func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		logs = append(logs, fmt.Sprintf(format, args...))
	}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "child New:", err)
		return 2
	}
	defer tr.Close()
	fmt.Println("ready")
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		cmd, arg, _ := strings.Cut(in.Text(), " ")
		switch cmd {
		case "offer":
			fmt.Println(tr.Offer(arg))
		case "withdraw":
			peerID, offer, _ := strings.Cut(arg, " ")
			tr.Withdraw(peerID, offer)
			fmt.Println("ok")
		case "sum":
			sum := sha256.Sum256(all)
			fmt.Println(hex.EncodeToString(sum[:]))
		case "truncate":
			if err := unix.Ftruncate(fd, 0); err != nil {
				fmt.Println("truncate:", err)
			} else {
				fmt.Println("ok")
			}
		case "resize":
			size, err := strconv.ParseInt(arg, 10, 64)
			if err == nil {
				err = unix.Ftruncate(fd, size)
			}
			if err != nil {
				fmt.Println("resize:", err)
			} else {
				fmt.Println("ok")
			}
		case "claim":
			var rows, size uint64
			if _, err := fmt.Sscanf(arg, "%d %d", &rows, &size); err != nil {
				fmt.Println("claim:", err)
				continue
			}
			tr.replyHook = func(r *reply) { r.numRows, r.fileSize = rows, size }
			fmt.Println("ok")
		case "logs":
			mu.Lock()
			fmt.Println(strings.Join(logs, " | ") + ".")
			mu.Unlock()
		default:
			fmt.Println("unknown command", cmd)
		}
	}
	return 0
}

// runProducerChild refuses itself access to other processes' memory, as
// Yama's ptrace_scope=1 refuses an engine toward its sibling (noptrace),
// then writes each of its patterned rows i to row i of the consumer and
// prints "ok" or what failed.
func runProducerChild(spec string) int {
	fields := strings.SplitN(spec, " ", 5)
	if len(fields) != 5 {
		fmt.Println("producer spec: want 5 fields")
		return 2
	}
	id, consumerID, offerString := fields[0], fields[3], fields[4]
	rows, err1 := strconv.Atoi(fields[1])
	rowLen, err2 := strconv.Atoi(fields[2])
	if err := errors.Join(err1, err2); err != nil {
		fmt.Println("producer spec:", err)
		return 2
	}
	if err := noptrace.Enter(); err != nil {
		fmt.Println(err)
		return 2
	}
	region, _, _, err := memfdRegion(rows, rowLen, 0)
	if err != nil {
		fmt.Println("producer region:", err)
		return 2
	}
	fillPattern(region)
	tr, err := New(Options{Region: region, LocalID: id, Workers: 3})
	if err != nil {
		fmt.Println("producer New:", err)
		return 2
	}
	defer tr.Close()
	if err := tr.AddPeer(consumerID, offeredRows(offerString, uint64(rows))); err != nil {
		fmt.Println("AddPeer:", err)
		return 2
	}
	all := make([]uint64, rows)
	for i := range all {
		all[i] = uint64(i)
	}
	job, err := tr.Write(consumerID, all, all)
	if err != nil {
		fmt.Println("Write:", err)
		return 2
	}
	select {
	case c := <-tr.Completions():
		if c.ID != job || c.Err != nil {
			fmt.Printf("completion %d: %v\n", c.ID, c.Err)
			return 2
		}
	case <-time.After(10 * time.Second):
		fmt.Println("no completion within 10s")
		return 2
	}
	fmt.Println("ok")
	return 0
}

// runRawClaim claims an offer as a producer that checks nothing of the
// socket's other end: it sends the request with the offer's token and its
// id, reads everything the consumer sends until it closes, and prints
// "fds N reply X": the file descriptors that came, and the first reply
// byte (0 granted, 1 refused; - for none).
func runRawClaim(spec string) int {
	id, offerString, _ := strings.Cut(spec, " ")
	o, err := parseOffer(offerString)
	if err != nil {
		fmt.Println("offer:", err)
		return 2
	}
	conn, err := net.DialTimeout("unix", o.socket, 5*time.Second)
	if err != nil {
		fmt.Println("dial:", err)
		return 2
	}
	c := conn.(*net.UnixConn)
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	req, err := request{token: o.token, peerID: id}.encode()
	if err != nil {
		fmt.Println("request:", err)
		return 2
	}
	_, _ = c.Write(req) // the consumer may have refused and closed already
	fds, first := 0, "-"
	var probes []string
	for {
		buf, oob := make([]byte, 512), make([]byte, unix.CmsgSpace(4*4))
		n, oobn, _, _, err := c.ReadMsgUnix(buf, oob)
		got, _ := parseRights(oob[:oobn])
		for _, fd := range got {
			probes = append(probes, probeGrantedFd(fd))
			_ = unix.Close(fd)
		}
		fds += len(got)
		if n > 0 && first == "-" {
			first = strconv.Itoa(int(buf[0]))
		}
		if err != nil || (n == 0 && oobn == 0) {
			break
		}
	}
	fmt.Printf("fds %d reply %s%s\n", fds, first, strings.Join(probes, ""))
	return 0
}

// probeGrantedFd tries what a claimant could do with a granted fd beyond
// writing rows, and says what the kernel answered to each: " read=ERR
// map=ERR shrink=ERR grow=ERR" ("ok" where it worked). It changes nothing:
// a shrink or grow that works is undone at once.
func probeGrantedFd(fd int) string {
	answer := func(err error) string {
		if err != nil {
			return err.Error()
		}
		return "ok"
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return " fstat=" + err.Error()
	}
	_, readErr := unix.Pread(fd, make([]byte, 1), 0)
	mem, mapErr := unix.Mmap(fd, 0, 4096, unix.PROT_READ, unix.MAP_SHARED)
	if mapErr == nil {
		_ = unix.Munmap(mem)
	}
	shrinkErr := unix.Ftruncate(fd, 0)
	growErr := unix.Ftruncate(fd, st.Size+4096)
	if shrinkErr == nil || growErr == nil {
		_ = unix.Ftruncate(fd, st.Size)
	}
	return fmt.Sprintf(" read=%s map=%s shrink=%s grow=%s", answer(readErr), answer(mapErr), answer(shrinkErr), answer(growErr))
}

// runForeignHandlerProducer hands SIGBUS to a plain C handler that exits
// (foreignsig; handler "foreign"), as a host that enables faulthandler after
// loading us does, or leaves it to Go ("go"), prints the copy path that
// choice gives ("path kernel" or "path mapped"), then writes its rows one batch at a time into the consumer of the offer.
// After the first batch the file on one side shrinks: "source" truncates
// our own region file, "destination" prints "shrink" and waits for a line
// on stdin while the consumer shrinks its. It prints "failed: ERR" or "ok"
// and exits 0, unless the handler killed it (foreignsig.ExitCode).
func runForeignHandlerProducer(spec string) int {
	const rows, rowLen = 16, 64 << 10
	handler, spec, _ := strings.Cut(spec, " ")
	shrunk, offerString, _ := strings.Cut(spec, " ")
	if handler == "foreign" {
		if err := foreignsig.InstallFatalSIGBUS(); err != nil {
			fmt.Println(err)
			return 2
		}
	}
	path := "kernel"
	if goHandlesSIGBUS() {
		path = "mapped"
	}
	fmt.Println("path", path)
	region, _, fd, err := memfdRegion(rows, rowLen, 0)
	if err != nil {
		fmt.Println("producer region:", err)
		return 2
	}
	fillPattern(region)
	tr, err := New(Options{Region: region, LocalID: prodID, Workers: 1})
	if err != nil {
		fmt.Println("producer New:", err)
		return 2
	}
	defer tr.Close()
	if err := tr.AddPeer(consID, offeredRows(offerString, rows)); err != nil {
		fmt.Println("AddPeer:", err)
		return 2
	}
	in := bufio.NewScanner(os.Stdin)
	batches := 0
	tr.batchHook = func() {
		if batches++; batches != 2 {
			return
		}
		if shrunk == "source" {
			_ = unix.Ftruncate(fd, 0)
			return
		}
		fmt.Println("shrink")
		in.Scan()
	}
	// Source rows in reverse merge into no batch: one row a batch.
	src, dst := make([]uint64, rows), make([]uint64, rows)
	for i := range src {
		src[i], dst[i] = uint64(rows-1-i), uint64(i)
	}
	job, err := tr.Write(consID, src, dst)
	if err != nil {
		fmt.Println("Write:", err)
		return 2
	}
	select {
	case c := <-tr.Completions():
		switch {
		case c.ID != job:
			fmt.Printf("completion of job %d, want %d\n", c.ID, job)
			return 2
		case c.Err != nil:
			fmt.Println("failed:", c.Err)
		default:
			fmt.Println("ok")
		}
	case <-time.After(10 * time.Second):
		fmt.Println("no completion within 10s")
		return 2
	}
	return 0
}

// childEnviron is this process's environment plus vars, for a child
// re-executing this test binary.
func childEnviron(vars ...string) []string {
	// The race runtime otherwise idles 1s at exit.
	return append(append(os.Environ(), vars...), "GORACE="+os.Getenv("GORACE")+" atexit_sleep_ms=0")
}

// child is a consumer process driven over its stdin and stdout.
type child struct {
	t     testing.TB
	stdin *os.File
	lines chan string
}

func startChild(t testing.TB, id string, rows, rowLen, skip int) *child {
	t.Helper()
	self, err := os.Executable()
	require.NoError(t, err)
	return startChildCmd(t, exec.Command(self, "-test.run=^$"), id, rows, rowLen, skip)
}

// startChildCmd starts cmd, a re-execution of this test binary, as a
// consumer child.
func startChildCmd(t testing.TB, cmd *exec.Cmd, id string, rows, rowLen, skip int) *child {
	t.Helper()
	cmd.Env = childEnviron(fmt.Sprintf("%s=%s %d %d %d", childEnv, id, rows, rowLen, skip))
	cmd.Stderr = os.Stderr
	stdinR, stdinW, err := os.Pipe()
	require.NoError(t, err)
	cmd.Stdin = stdinR
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	_ = stdinR.Close()
	c := &child{t: t, stdin: stdinW, lines: make(chan string, 16)}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		_ = stdinW.Close()
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	require.Equal(t, "ready", c.line())
	return c
}

func (c *child) line() string {
	c.t.Helper()
	select {
	case l, ok := <-c.lines:
		require.True(c.t, ok, "the child exited")
		return l
	case <-time.After(10 * time.Second):
		c.t.Fatal("the child said nothing for 10s")
		return ""
	}
}

// ask sends one command and returns the child's answer.
func (c *child) ask(format string, args ...any) string {
	c.t.Helper()
	_, err := fmt.Fprintf(c.stdin, format+"\n", args...)
	require.NoError(c.t, err)
	return c.line()
}

// otherUser is the uid and gid another user's processes run as here.
const otherUser = 65534 // nobody

// commandAsOtherUser runs this test binary as otherUser: a copy of it, in a
// directory that user may enter (go test's own is the caller's alone). It
// needs root; without root the test is skipped, unless
// PEERKV_REQUIRE_SECOND_USER=1 (make test-go) makes that a failure.
func commandAsOtherUser(t *testing.T) *exec.Cmd {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("PEERKV_REQUIRE_SECOND_USER") == "1" {
			t.Fatal("starting a process as another user needs root (PEERKV_REQUIRE_SECOND_USER=1)")
		}
		t.Skip("starting a process as another user needs root")
	}
	self, err := os.Executable()
	require.NoError(t, err)
	bin, err := os.ReadFile(self)
	require.NoError(t, err)
	dir, err := os.MkdirTemp("", "peerkv-shmdata-other-user-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	path := filepath.Join(dir, filepath.Base(self))
	require.NoError(t, os.WriteFile(path, bin, 0o755))
	cmd := exec.Command(path, "-test.run=^$")
	cmd.Dir = dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: otherUser, Gid: otherUser}}
	return cmd
}

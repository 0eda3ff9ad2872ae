package shmdata

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/peerkv/peerkv/core/data"
)

const (
	prodID = "127.0.0.1:7001"
	consID = "127.0.0.1:7002"
)

// producer is a transport in this process over a memfd region whose rows
// hold a pattern that differs per row.
func producer(t testing.TB, id string, rows, rowLen int, logf ...func(string, ...any)) (*Transport, data.Region) {
	t.Helper()
	region, _, fd, err := memfdRegion(rows, rowLen, 0)
	require.NoError(t, err)
	fillPattern(region)
	opts := Options{Region: region, LocalID: id, Workers: 3}
	if len(logf) > 0 {
		opts.Logf = logf[0]
	}
	tr, err := New(opts)
	require.NoError(t, err)
	t.Cleanup(func() {
		_ = tr.Close()
		_ = unix.Munmap(region.Mem)
		_ = unix.Close(fd)
	})
	return tr, region
}

// fillPattern fills every row with a pattern that differs per row.
func fillPattern(region data.Region) {
	rowLen := int(region.RowLen)
	for i := range region.Mem {
		region.Mem[i] = byte(i*7) ^ byte(i/rowLen) ^ 0x5a
	}
}

func completion(t testing.TB, tr *Transport, id uint64) error {
	t.Helper()
	select {
	case c := <-tr.Completions():
		require.Equal(t, id, c.ID)
		return c.Err
	case <-time.After(10 * time.Second):
		t.Fatal("no completion within 10s")
		return nil
	}
}

// declaredRows is what the sessions of most tests declare (num_blocks):
// more than any of their consumers grants.
const declaredRows = 1 << 20

func offered(offer string) data.PeerInfo { return offeredRows(offer, declaredRows) }

// offeredRows is what a session hands the path: the offer, and the row
// count the peer declared.
func offeredRows(offer string, rows uint64) data.PeerInfo {
	return data.PeerInfo{NumRows: rows, Grants: data.Grants{SameHost: offer}}
}

// Both copies (sigbus.go): the memcpy one while Go handles SIGBUS, the
// kernel's one otherwise.
func TestRowsLandByteForByteAndNothingElse(t *testing.T) {
	for _, kernel := range []bool{false, true} {
		t.Run(fmt.Sprintf("kernel copy %v", kernel), func(t *testing.T) { rowsLandByteForByte(t, kernel) })
	}
}

func rowsLandByteForByte(t *testing.T, kernelCopyOnly bool) {
	const rows, rowLen, skip = 300, 4096, 96 // the region starts mid-page in its file
	cons := startChild(t, consID, rows, rowLen, skip)
	tr, src := producer(t, prodID, rows, rowLen)
	tr.kernelCopyOnly = kernelCopyOnly
	assert.Equal(t, "shm", tr.Name())
	require.NoError(t, tr.AddPeer(consID, offered(cons.ask("offer %s", prodID))))

	// A consecutive run, scattered rows into a reversed run, and a run of
	// ours into pairs of rows apart in the peer's (one read, many pieces).
	var from, to []uint64
	for i := range uint64(100) {
		from, to = append(from, i), append(to, i+10)
	}
	for i := range uint64(100) {
		from, to = append(from, 150+i*7%100), append(to, rows-1-i)
	}
	for i := range uint64(60) {
		from, to = append(from, i), append(to, 110+i/2*3+i%2)
	}
	id, err := tr.Write(consID, from, to)
	require.NoError(t, err)
	require.NoError(t, completion(t, tr, id))

	want := make([]byte, skip+rows*rowLen) // the consumer's file started zeroed
	for i := range from {
		copy(want[skip+to[i]*rowLen:], src.Row(from[i]))
	}
	sum := sha256.Sum256(want)
	assert.Equal(t, hex.EncodeToString(sum[:]), cons.ask("sum"), "every written row holds its source row, every other byte is untouched")
}

// consumerRegion is a memfd region in this process, zeroed, and a
// transport serving it as consID.
func consumerRegion(t *testing.T, rows, rowLen int, logf func(string, ...any)) (*Transport, data.Region) {
	t.Helper()
	tr, region, _ := consumerRegionFd(t, rows, rowLen, 0, logf)
	return tr, region
}

// consumerRegionFd is consumerRegion over a memfd made with flags (such as
// unix.MFD_ALLOW_SEALING) and returns the memfd too.
func consumerRegionFd(t *testing.T, rows, rowLen, flags int, logf func(string, ...any)) (*Transport, data.Region, int) {
	t.Helper()
	region, fd, err := memfdRegionFlags(rows, rowLen, flags)
	require.NoError(t, err)
	t.Cleanup(func() { _ = unix.Munmap(region.Mem); _ = unix.Close(fd) })
	cons, err := New(Options{Region: region, LocalID: consID, Logf: logf})
	require.NoError(t, err)
	t.Cleanup(func() { _ = cons.Close() })
	return cons, region, fd
}

// runProducerCmd runs cmd, a re-execution of this test binary, as a
// producer child (runProducerChild) writing every row to consID with
// offer, and returns what it printed.
func runProducerCmd(t *testing.T, cmd *exec.Cmd, rows, rowLen int, offer string) (string, error) {
	t.Helper()
	cmd.Env = childEnviron(fmt.Sprintf("%s=%s %d %d %s %s", producerEnv, prodID, rows, rowLen, consID, offer))
	return runBounded(t, cmd)
}

// runBounded runs a child to its end, killed after 30 s, and returns its
// standard output.
func runBounded(t *testing.T, cmd *exec.Cmd) (string, error) {
	t.Helper()
	cmd.Stderr = os.Stderr
	var out bytes.Buffer
	cmd.Stdout = &out
	require.NoError(t, cmd.Start())
	proc := cmd.Process
	bound := time.AfterFunc(30*time.Second, func() { _ = proc.Kill() })
	defer bound.Stop()
	err := cmd.Wait()
	return out.String(), err
}

// Engines are siblings: under Yama's ptrace_scope=1 (Ubuntu's default)
// neither may ptrace the other or use process_vm_writev on it. The
// same-host path needs neither: the consumer hands over its region's fd.
func TestAProducerRefusedPtraceStillWritesEveryRow(t *testing.T) {
	const rows, rowLen = 64, 8192
	cons, region := consumerRegion(t, rows, rowLen, nil)
	self, err := os.Executable()
	require.NoError(t, err)
	out, err := runProducerCmd(t, exec.Command(self, "-test.run=^$"), rows, rowLen, cons.Offer(prodID))
	require.NoError(t, err, "the producer said: %s", out)
	require.Equal(t, "ok\n", out)

	want := make([]byte, rows*rowLen)
	fillPattern(data.Region{Mem: want, RowLen: rowLen})
	assert.True(t, bytes.Equal(want, region.Mem), "every row landed byte for byte")
}

// H1: the kernel's credentials of the socket's other end decide, whatever
// token or id it presents.
func TestAProcessOfAnotherUserGetsNoGrantAndIsNotWritten(t *testing.T) {
	const rows, rowLen = 8, 4096
	t.Run("its producer gets no fd from our consumer", func(t *testing.T) {
		var mu sync.Mutex
		var logs []string
		cons, region := consumerRegion(t, rows, rowLen, func(format string, args ...any) {
			mu.Lock()
			defer mu.Unlock()
			logs = append(logs, fmt.Sprintf(format, args...))
		})
		// It checks nothing of our socket and presents the right token
		// and id: only our check stands between it and the region's fd.
		cmd := commandAsOtherUser(t)
		cmd.Env = childEnviron(rawClaimEnv + "=" + prodID + " " + cons.Offer(prodID))
		out, err := runBounded(t, cmd)
		require.NoError(t, err, "the claimant said: %s", out)
		assert.Equal(t, fmt.Sprintf("fds 0 reply %d\n", statusRefused), out, "refused, and no fd came")
		assert.Equal(t, make([]byte, rows*rowLen), region.Mem, "nothing was written")
		require.Eventually(t, func() bool {
			mu.Lock()
			defer mu.Unlock()
			return strings.Contains(strings.Join(logs, "\n"), fmt.Sprintf("runs as uid %d", otherUser))
		}, 10*time.Second, 5*time.Millisecond, "the refusal is logged, naming the uid")
	})
	t.Run("its consumer is not written by our producer", func(t *testing.T) {
		cons := startChildCmd(t, commandAsOtherUser(t), consID, rows, rowLen, 0)
		zero := sha256.Sum256(make([]byte, rows*rowLen))
		tr, _ := producer(t, prodID, rows, rowLen)
		err := tr.AddPeer(consID, offered(cons.ask("offer %s", prodID)))
		assert.ErrorContains(t, err, fmt.Sprintf("runs as uid %d", otherUser))
		_, err = tr.Write(consID, []uint64{0}, []uint64{0})
		assert.Error(t, err, "no write to a peer that was refused")
		assert.Equal(t, hex.EncodeToString(zero[:]), cons.ask("sum"), "its region is untouched")
	})
}

func TestWritesStayWithinTheGrantedRows(t *testing.T) {
	cons := startChild(t, consID, 8, 4096, 0)
	tr, _ := producer(t, prodID, 16, 4096)
	// The connect's claims are ignored: only the grant sizes the mapping.
	info := offered(cons.ask("offer %s", prodID))
	info.BaseAddr, info.NumRows, info.RowLen = 0x1000, 1<<40, 4096
	require.NoError(t, tr.AddPeer(consID, info))

	for _, row := range []uint64{8, 1 << 39} {
		_, err := tr.Write(consID, []uint64{0}, []uint64{row})
		assert.ErrorIs(t, err, data.ErrRowOutOfRange, "the peer granted 8 rows, not %d", row+1)
	}
	_, err := tr.Write(consID, []uint64{16}, []uint64{0})
	assert.ErrorIs(t, err, data.ErrRowOutOfRange, "we have 16 rows")
	_, err = tr.Write(consID, []uint64{0, 1}, []uint64{0})
	assert.Error(t, err)
	_, err = tr.Write("nobody", []uint64{0}, []uint64{0})
	assert.ErrorIs(t, err, data.ErrUnknownPeer)

	id, err := tr.Write(consID, []uint64{15}, []uint64{7})
	require.NoError(t, err, "the last granted row is writable")
	require.NoError(t, completion(t, tr, id))
	tr.RemovePeer(consID)
	_, err = tr.Write(consID, []uint64{0}, []uint64{0})
	assert.ErrorIs(t, err, data.ErrUnknownPeer)
}

func TestGrantsReachOnlyThePeerTheyWereIssuedTo(t *testing.T) {
	cons := startChild(t, consID, 8, 4096, 0)
	tr, _ := producer(t, prodID, 8, 4096)

	good := cons.ask("offer %s", prodID)
	last := good[len(good)-1:]
	flipped := good[:len(good)-1] + map[bool]string{true: "1", false: "0"}[last == "0"]
	err := tr.AddPeer(consID, offered(flipped))
	assert.ErrorContains(t, err, "refused the grant", "a wrong token")

	err = tr.AddPeer(consID, offered(cons.ask("offer %s", "127.0.0.1:9999")))
	assert.ErrorContains(t, err, "refused the grant", "a token issued to another peer")

	err = tr.AddPeer("127.0.0.1:6666", offered(cons.ask("offer %s", prodID)))
	assert.ErrorContains(t, err, `belongs to peer "`+consID+`"`, "the socket is not the session's peer")

	withdrawn := cons.ask("offer %s", prodID)
	require.Equal(t, "ok", cons.ask("withdraw %s %s", prodID, withdrawn))
	err = tr.AddPeer(consID, offered(withdrawn))
	assert.ErrorContains(t, err, "refused the grant", "a withdrawn offer")

	replaced := cons.ask("offer %s", prodID)
	current := cons.ask("offer %s", prodID)
	assert.ErrorContains(t, tr.AddPeer(consID, offered(replaced)), "refused the grant", "a newer offer replaces an older one")

	logs := cons.ask("logs")
	assert.Equal(t, 4, strings.Count(logs, "no such live grant"), logs)
	assert.Contains(t, logs, `claiming peer "`+prodID+`"`)

	require.NoError(t, tr.AddPeer(consID, offered(current)), "the current offer to us still works")
	id, err := tr.Write(consID, []uint64{1}, []uint64{2})
	require.NoError(t, err)
	require.NoError(t, completion(t, tr, id))
}

func TestMalformedOffersAreRefused(t *testing.T) {
	tr, _ := producer(t, prodID, 4, 4096)
	good := tr.Offer("127.0.0.1:1")
	_, err := parseOffer(good)
	require.NoError(t, err)
	sock, tok, _ := strings.Cut(strings.TrimPrefix(good, "v2 "), " ")
	for _, s := range []string{
		"",
		"v1 " + sock + " " + tok, // an older release's offer
		"v2 " + sock,
		"v2  " + sock + " " + tok,
		"v2 " + sock + " " + tok + " ",
		"v2 " + sock + " " + strings.ToUpper(tok),
		"v2 " + sock + " " + tok[:30],
		"v2 " + sock + " " + tok + "00",
		"v2 @other-" + strings.TrimPrefix(sock, "@peerkv-") + " " + tok,
		"v2 /tmp/peerkv.sock " + tok,
		"v2 " + sock + "\x00 " + tok,
		"v2 " + sock + " " + tok + "\n",
	} {
		err := tr.AddPeer(consID, offered(s))
		assert.Error(t, err, "%q", s)
	}
	_, err = parseOffer("v1 " + sock + " " + tok)
	assert.ErrorIs(t, err, errOfferVersion, "an older release's offer is named as such")
}

func TestOwnProcessIsNeverWritten(t *testing.T) {
	// The reflection attack: a remote peer echoes our own offer back, or
	// one for another transport of ours. Tokens and ids are right; only
	// the kernel's pid check tells the socket is in this process.
	var logged atomic.Int32
	victim, _ := producer(t, consID, 8, 4096, func(string, ...any) { logged.Add(1) })
	tr, _ := producer(t, prodID, 8, 4096)

	err := tr.AddPeer(consID, offered(victim.Offer(prodID)))
	assert.ErrorContains(t, err, "this very process")
	err = victim.AddPeer(consID, offered(victim.Offer(consID)))
	assert.ErrorContains(t, err, "this very process")
	require.Eventually(t, func() bool { return logged.Load() == 2 }, 5*time.Second, 5*time.Millisecond,
		"the serving side refuses our own process too")
}

func TestTruncatedConsumerFailsTheTransferNotTheProcess(t *testing.T) {
	cons := startChild(t, consID, 64, 4096, 0)
	tr, _ := producer(t, prodID, 64, 4096)
	require.NoError(t, tr.AddPeer(consID, offered(cons.ask("offer %s", prodID))))
	require.Equal(t, "ok", cons.ask("truncate"))

	rows := []uint64{0, 1, 2, 3, 40, 41, 63}
	id, err := tr.Write(consID, rows, rows)
	require.NoError(t, err)
	err = completion(t, tr, id)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "shrank")
}

func TestRegionsThatCannotBeGrantedFailNewClearly(t *testing.T) {
	const size = 4 * 4096
	shared, err := unix.Mmap(-1, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(shared)

	fd, err := unix.MemfdCreate("peerkv-private", unix.MFD_CLOEXEC)
	require.NoError(t, err)
	require.NoError(t, unix.Ftruncate(fd, size))
	private, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE)
	require.NoError(t, err)
	defer unix.Munmap(private)
	orphan, err := unix.Mmap(fd, 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	require.NoError(t, err)
	defer unix.Munmap(orphan)
	require.NoError(t, unix.Close(fd)) // a memfd nobody keeps open has no name to reopen

	onDisk := diskMapping(t, size)
	for name, c := range map[string]struct {
		mem  []byte
		want string
	}{
		"file on disk":     {onDisk, "not in memory"},
		"go heap":          {make([]byte, size), "the region is anonymous memory"},
		"shared anonymous": {shared, "the region is anonymous memory"},
		"private mapping":  {private, "private (copy-on-write) mapping"},
		"memfd not open":   {orphan, "no file descriptor"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := New(Options{Region: data.Region{Mem: c.mem, RowLen: 4096}, LocalID: prodID})
			require.Error(t, err)
			assert.Contains(t, err.Error(), c.want)
		})
	}
}

func TestCloseAndRemovalFailRunningTransfers(t *testing.T) {
	cons := startChild(t, consID, 64, 4096, 0)
	rows := make([]uint64, 64)
	for i := range rows {
		rows[i] = uint64(i)
	}
	// Each copy waits at its first batch until done() holds, so the
	// transfer is surely running when Close or RemovePeer comes.
	hold := func(tr *Transport, done func() bool) <-chan struct{} {
		started := make(chan struct{}, 1)
		tr.batchHook = func() {
			select {
			case started <- struct{}{}:
			default:
			}
			for deadline := time.Now().Add(5 * time.Second); !done() && time.Now().Before(deadline); {
				time.Sleep(time.Millisecond)
			}
		}
		return started
	}

	t.Run("close", func(t *testing.T) {
		tr, _ := producer(t, prodID, 64, 4096)
		started := hold(tr, tr.isClosed)
		require.NoError(t, tr.AddPeer(consID, offered(cons.ask("offer %s", prodID))))
		id, err := tr.Write(consID, rows, rows)
		require.NoError(t, err)
		<-started
		require.NoError(t, tr.Close())
		require.NoError(t, tr.Close(), "Close is idempotent")
		assert.ErrorIs(t, completion(t, tr, id), data.ErrClosed)
		_, open := <-tr.Completions()
		assert.False(t, open, "Completions is closed after Close")
		assert.Empty(t, tr.Offer(consID), "a closed transport offers nothing")
	})
	t.Run("remove", func(t *testing.T) {
		tr, _ := producer(t, prodID, 64, 4096)
		var removed atomic.Bool
		started := hold(tr, removed.Load)
		require.NoError(t, tr.AddPeer(consID, offered(cons.ask("offer %s", prodID))))
		id, err := tr.Write(consID, rows, rows)
		require.NoError(t, err)
		<-started
		tr.mu.Lock()
		p := tr.peers[consID]
		tr.mu.Unlock()
		tr.RemovePeer(consID)
		tr.mu.Lock()
		assert.GreaterOrEqual(t, p.fd, 0, "the fd stays open while a copy runs")
		tr.mu.Unlock()
		removed.Store(true)
		assert.ErrorContains(t, completion(t, tr, id), "peer removed")
		tr.mu.Lock()
		assert.Equal(t, -1, p.fd, "the last copy out closes the fd")
		tr.mu.Unlock()
	})
}

func TestGrantsExpireAndStayBounded(t *testing.T) {
	g := newGrants(time.Minute)
	now := time.Now()
	g.now = func() time.Time { return now }
	tok, err := g.issue(prodID)
	require.NoError(t, err)
	assert.NoError(t, g.use(prodID, tok))
	tok, err = g.issue(prodID)
	require.NoError(t, err)
	now = now.Add(2 * time.Minute)
	assert.ErrorIs(t, g.use(prodID, tok), errNoSuchGrant, "an expired token grants nothing")

	for i := range maxGrants + 10 {
		_, err := g.issue(fmt.Sprintf("127.0.0.1:%d", i))
		require.NoError(t, err)
	}
	assert.LessOrEqual(t, len(g.byPeer), maxGrants)
}

// diskMapping maps a shared file from a directory that is not tmpfs.
func diskMapping(t *testing.T, size int) []byte {
	for _, dir := range []string{t.TempDir(), "."} {
		var fs unix.Statfs_t
		require.NoError(t, unix.Statfs(dir, &fs))
		if fs.Type == unix.TMPFS_MAGIC {
			continue
		}
		f, err := os.CreateTemp(dir, "peerkv-disk-region-*")
		require.NoError(t, err)
		t.Cleanup(func() { _ = os.Remove(f.Name()); _ = f.Close() })
		require.NoError(t, f.Truncate(int64(size)))
		mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		require.NoError(t, err)
		t.Cleanup(func() { _ = unix.Munmap(mem) })
		return mem
	}
	t.Fatal("no directory off tmpfs to make a disk-backed region in")
	return nil
}

// A canceled copy stops at its next batch and is reported canceled; a
// cancel naming another peer, or an id not running, changes nothing.
func TestCancelStopsACopyUnderWay(t *testing.T) {
	cons := startChild(t, consID, 64, 4096, 0)
	rows := make([]uint64, 64)
	for i := range rows {
		rows[i] = uint64(i)
	}
	tr, _ := producer(t, prodID, 64, 4096)
	started, canceled := make(chan struct{}, 1), make(chan struct{})
	var once sync.Once
	tr.batchHook = func() {
		once.Do(func() {
			started <- struct{}{}
			select {
			case <-canceled:
			case <-time.After(5 * time.Second):
			}
		})
	}
	require.NoError(t, tr.AddPeer(consID, offered(cons.ask("offer %s", prodID))))
	id, err := tr.Write(consID, rows, rows)
	require.NoError(t, err)
	<-started
	var c data.Canceler = tr
	c.Cancel("someone else", id)
	c.Cancel(consID, id+1)
	c.Cancel(consID, id)
	close(canceled)
	assert.ErrorIs(t, completion(t, tr, id), data.ErrCanceled)

	next, err := tr.Write(consID, rows[:1], rows[:1])
	require.NoError(t, err)
	assert.NoError(t, completion(t, tr, next))
}

// Command multisource measures one prompt pulled from 1, 2 and 3 sources
// that all hold it: full peers (ZMQ control, TCP data path, the tier) in
// separate processes on loopback, the consumer in this one.
//
// The program re-executes itself as each producer (env childEnv set): it
// fills -rows rows of -row-mib MiB with a pattern derived from the key,
// prints "ready <port>", and answers every inbound lookup HIT (pinning the
// row) until its stdin closes. The consumer pulls the whole prefix with
// remote_kv_source listing the first n producers (ids left to it to mint),
// and times the load job alone (submit_load to its report; the lookups
// are answered before, by every source, after a warm-up that opened the
// sessions). Every row that lands is checked (CRC32) before the
// next pull; figures are medians of -iters pulls, GB = 10^9 bytes.
//
// Then the same 1 GiB prompt from one producer on this host with the
// default data_transport (the same-host path), into a warm consumer region
// and into a cold one (its pages dropped before every pull, as in a freshly
// started engine), each against single-thread memcpy of the same bytes into
// an equally warm or cold region, measured in the same run. Every producer
// is refused the calls in noptrace.Refused (ptrace, process_vm_writev, ...),
// as an engine is toward its sibling under Yama's ptrace_scope=1. Last, the
// same prompt from one producer with verified pulls and without (two
// consumers on one region, in turn), over TCP and over the same-host path
// (-checks-only runs only that part):
//
//	multisource: 512x2MiB from 1 source: 2.10 GB/s (load 0.51 s) x1.00
//	multisource: 512x2MiB from 2 sources: 3.50 GB/s (load 0.31 s) x1.67
//	multisource: 512x2MiB from 3 sources: 3.90 GB/s (load 0.28 s) x1.86
//	multisource: same host (shm) 512x2MiB, warm region: 14.2 GB/s (load 0.076 s); memcpy 13.9 GB/s; time ÷ memcpy 0.98; the producer is refused ptrace, process_vm_readv, process_vm_writev, process_madvise, pidfd_getfd
//	multisource: same host (shm) 512x2MiB, cold region: 1.90 GB/s (load 0.565 s); memcpy 0.95 GB/s; time ÷ memcpy 0.50; the producer is refused ptrace, process_vm_readv, process_vm_writev, process_madvise, pidfd_getfd
//	multisource: verified pulls (XXH3-64) over TCP 512x2MiB: load 1.041 s with checks, 0.846 s without; with ÷ without 1.23
package main

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"flag"
	"fmt"
	"hash/crc32"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/tier"
	"github.com/peerkv/peerkv/tests/bench/internal/benchproc"
	"github.com/peerkv/peerkv/tests/hostsim"
	"github.com/peerkv/peerkv/tests/noptrace"
)

const (
	childEnv     = "PEERKV_MULTISOURCE_CHILD" // its value: the producer's data_transport
	childTimeout = 60 * time.Second           // bound on any wait for a producer
	settleBound  = 30 * time.Second           // lookups answered, a load reported
	keyLen       = 36
)

type params struct {
	rows, rowMiB, iters, sources int
	checksOnly                   bool
}

func main() {
	var p params
	flag.IntVar(&p.rows, "rows", 512, "rows in the prompt (and in every region)")
	flag.IntVar(&p.rowMiB, "row-mib", 2, "row size in MiB")
	flag.IntVar(&p.iters, "iters", 3, "pulls per source count (median reported)")
	flag.IntVar(&p.sources, "sources", 3, "measure 1..sources sources")
	flag.BoolVar(&p.checksOnly, "checks-only", false, "measure only the pull time with and without verified pulls")
	flag.Parse()
	var err error
	if os.Getenv(childEnv) != "" {
		err = runProducer(p)
	} else {
		err = runConsumer(p)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "multisource:", err)
		os.Exit(1)
	}
}

func (p params) rowLen() uint64 { return uint64(p.rowMiB) << 20 }

// region maps rows outside the Go heap as a host's region is: a shared
// file mapping, which the same-host path can be granted.
func (p params) region() (data.Region, error) {
	return benchproc.Region("peerkv-multisource", p.rows, p.rowLen())
}

func key(i int) []byte {
	k := sha256.Sum256([]byte("multisource-" + strconv.Itoa(i)))
	return append(k[:], 0, 0, 0, 0)
}

// fill writes row i's pattern (what the consumer checks).
func fill(row []byte, i int) {
	seed := binary.LittleEndian.Uint64(key(i))
	for off := 0; off+8 <= len(row); off += 8 {
		binary.LittleEndian.PutUint64(row[off:], seed^uint64(off))
	}
}

// open starts a peer on 127.0.0.1 at a free port with the given
// data_transport ("tcp": TCP only; "auto": the same-host path to a peer here).
func (p params) open(region data.Region, transport string) (*tier.Tier, error) {
	return p.openVerifying(region, transport, true)
}

// openVerifying is open with verify_pulls set as given.
func (p params) openVerifying(region data.Region, transport string, verify bool) (*tier.Tier, error) {
	return benchproc.Open(region, func(port int) string {
		return fmt.Sprintf(`{"host":"127.0.0.1","port":%d,"data_port":0,"data_transport":%q,"key_len":%d,"hash_seed":"bench","load_timeout_s":120,"lookup_timeout_s":30,"verify_pulls":%t}`,
			port, transport, keyLen, verify)
	})
}

// runProducer holds every row and serves lookups until stdin closes. It
// may not reach the consumer's memory with ptrace or process_vm_writev, as
// an engine on a host with Yama's ptrace_scope=1 may not its sibling's
// (noptrace).
func runProducer(p params) error {
	if err := noptrace.Enter(); err != nil {
		return err
	}
	region, err := p.region()
	if err != nil {
		return err
	}
	for i := range p.rows {
		fill(region.Row(uint64(i)), i)
	}
	row := map[string]int64{}
	for i := range p.rows {
		row[string(key(i))] = int64(i)
	}
	t, err := p.open(region, os.Getenv(childEnv))
	if err != nil {
		return err
	}
	defer t.Shutdown()
	eof := make(chan struct{})
	go func() {
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		close(eof)
	}()
	fmt.Printf("ready %s\n", t.LocalID()[strings.LastIndexByte(t.LocalID(), ':')+1:])
	pins := hostsim.Count(new(int64))
	for {
		select {
		case <-eof:
			return nil
		default:
		}
		_ = t.GetFinished(1024) // pin jobs released once fetched
		served, err := hostsim.Serve(t, hostsim.Rows(row), pins)
		if err != nil {
			return err
		}
		if served == 0 {
			time.Sleep(200 * time.Microsecond)
		}
	}
}

type producer struct {
	cmd  *exec.Cmd
	port int
	in   interface{ Close() error }
}

func startProducer(transport string) (*producer, error) {
	cmd := exec.Command(os.Args[0], os.Args[1:]...)
	cmd.Env = append(os.Environ(), childEnv+"="+transport)
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
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- s
	}()
	select {
	case s := <-line:
		port, err := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(s, "ready ")))
		if err != nil {
			_ = cmd.Process.Kill()
			return nil, fmt.Errorf("producer said %q", s)
		}
		return &producer{cmd: cmd, port: port, in: stdin}, nil
	case <-time.After(childTimeout):
		_ = cmd.Process.Kill()
		return nil, fmt.Errorf("producer not ready within %v", childTimeout)
	}
}

func (pr *producer) stop() {
	_ = pr.in.Close()
	done := make(chan struct{})
	go func() { _ = pr.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(childTimeout):
		_ = pr.cmd.Process.Kill()
		<-done
	}
}

func runConsumer(p params) error {
	region, err := p.region()
	if err != nil {
		return err
	}
	want := make([]uint32, p.rows)
	scratch := make([]byte, p.rowLen())
	for i := range p.rows {
		fill(scratch, i)
		want[i] = crc32.ChecksumIEEE(scratch)
	}
	c := &consumer{p: p, region: region, want: want}
	for i := range p.rows {
		c.keys = append(c.keys, key(i))
		c.slots = append(c.slots, int64(i))
	}
	if p.checksOnly {
		return c.checksums()
	}
	if err := c.fromSources(); err != nil {
		return err
	}
	if err := c.sameHost(); err != nil {
		return err
	}
	return c.checksums()
}

// checksums times the same pull from one producer with verified pulls (the
// default) and without (the consumer's verify_pulls false), alternating
// between two consumers on one region, over TCP and over the same-host
// path into a warm region.
func (c *consumer) checksums() error {
	for _, transport := range []string{"tcp", "auto"} {
		pr, err := startProducer(transport)
		if err != nil {
			return err
		}
		defer pr.stop()
		var consumers [2]*tier.Tier // with, without
		for i, verify := range []bool{true, false} {
			t, err := c.p.openVerifying(c.region, transport, verify)
			if err != nil {
				return err
			}
			defer t.Shutdown()
			c.job++
			if _, err := pull(t, fmt.Sprintf("checks-warm-up-%t", verify), []*producer{pr}, c.keys[:1], c.slots[:1], c.job); err != nil {
				return fmt.Errorf("checksums warm-up: %w", err)
			}
			consumers[i] = t
		}
		var secs [2][]float64
		for it := range c.p.iters {
			for i, t := range consumers {
				s, err := c.timedPull(t, fmt.Sprintf("checks-%s-%d-%d", transport, i, it), []*producer{pr}, func() { clear(c.region.Mem) })
				if err != nil {
					return fmt.Errorf("checksums over %s: %w", transport, err)
				}
				secs[i] = append(secs[i], s)
			}
		}
		if st := consumers[0].Stats(); st.IntegrityFailures["mismatch"] != 0 || st.IntegrityFailures["missing"] != 0 {
			return fmt.Errorf("checksums over %s: integrity failures %v", transport, st.IntegrityFailures)
		}
		with, without := benchproc.Median(secs[0]), benchproc.Median(secs[1])
		fmt.Printf("multisource: verified pulls (XXH3-64) over %s %dx%dMiB: load %.3f s with checks, %.3f s without; with ÷ without %.2f\n",
			map[string]string{"tcp": "TCP", "auto": "the same-host path (shm), warm region"}[transport], c.p.rows, c.p.rowMiB, with, without, with/without)
	}
	return nil
}

// consumer pulls the whole prompt into its region and checks every row.
type consumer struct {
	p      params
	region data.Region
	want   []uint32
	keys   [][]byte
	slots  []int64
	job    int64
}

func (c *consumer) bytes() float64 { return float64(c.p.rows) * float64(c.p.rowLen()) }

// session starts n producers with the given data_transport and a consumer
// tier, and opens every session (handshakes are not part of a pull).
func (c *consumer) session(n int, transport string) (*tier.Tier, []*producer, func(), error) {
	var producers []*producer
	stop := func() {
		for _, pr := range producers {
			pr.stop()
		}
	}
	for range n {
		pr, err := startProducer(transport)
		if err != nil {
			stop()
			return nil, nil, nil, err
		}
		producers = append(producers, pr)
	}
	t, err := c.p.open(c.region, transport)
	if err != nil {
		stop()
		return nil, nil, nil, err
	}
	end := func() { t.Shutdown(); stop() }
	c.job++
	if _, err := pull(t, "warm-up", producers, c.keys[:1], c.slots[:1], c.job); err != nil {
		end()
		return nil, nil, nil, fmt.Errorf("warm-up: %w", err)
	}
	return t, producers, end, nil
}

// timedPull runs prepare, then one pull, checks every row, and returns the
// load's seconds.
func (c *consumer) timedPull(t *tier.Tier, req string, producers []*producer, prepare func()) (float64, error) {
	prepare()
	c.job++
	s, err := pull(t, req, producers, c.keys, c.slots, c.job)
	if err != nil {
		return 0, err
	}
	for i := range c.p.rows {
		if crc32.ChecksumIEEE(c.region.Row(uint64(i))) != c.want[i] {
			return 0, fmt.Errorf("%s: row %d differs from the producer's bytes", req, i)
		}
	}
	return s, nil
}

// fromSources pulls the prompt over TCP from 1..p.sources producers.
func (c *consumer) fromSources() error {
	t, producers, end, err := c.session(c.p.sources, "tcp")
	if err != nil {
		return err
	}
	defer end()
	var base float64
	for n := 1; n <= c.p.sources; n++ {
		var secs []float64
		for it := range c.p.iters {
			spread := t.Stats().LoadsSpread
			s, err := c.timedPull(t, fmt.Sprintf("pull-%d-%d", n, it), producers[:n], func() { clear(c.region.Mem) })
			if err != nil {
				return fmt.Errorf("%d sources: %w", n, err)
			}
			if n > 1 && t.Stats().LoadsSpread != spread+1 {
				return fmt.Errorf("%d sources: the load was not spread", n)
			}
			secs = append(secs, s)
		}
		gbps := c.bytes() / benchproc.Median(secs) / 1e9
		if n == 1 {
			base = gbps
		}
		plural := "s"
		if n == 1 {
			plural = ""
		}
		fmt.Printf("multisource: %dx%dMiB from %d source%s: %.2f GB/s (load %.3f s) x%.2f\n",
			c.p.rows, c.p.rowMiB, n, plural, gbps, benchproc.Median(secs), gbps/base)
	}
	st := t.Stats()
	fmt.Printf("multisource: verified every row; loads spread %d, kv ids minted %d\n", st.LoadsSpread, st.KVIDsMinted)
	return nil
}

// sameHost pulls the prompt from one producer on this host with the default
// data_transport, into a warm region and into a cold one, each against
// memcpy of the same bytes into a region in the same state.
func (c *consumer) sameHost() error {
	t, producers, end, err := c.session(1, "auto")
	if err != nil {
		return err
	}
	defer end()
	src, err := c.p.region() // memcpy's source: the producer's rows, warm
	if err != nil {
		return err
	}
	defer func() { _ = unix.Munmap(src.Mem) }()
	for i := range c.p.rows {
		fill(src.Row(uint64(i)), i)
	}
	warm := func() { clear(c.region.Mem) }
	cold := func() { dropPages(c.region) }
	before := t.Stats().Paths["shm"].Loads
	for _, mode := range []struct {
		name    string
		prepare func()
	}{{"warm", warm}, {"cold", cold}} {
		var secs, copies []float64
		for it := range c.p.iters {
			s, err := c.timedPull(t, fmt.Sprintf("same-host-%s-%d", mode.name, it), producers, mode.prepare)
			if err != nil {
				return fmt.Errorf("same host, %s region: %w", mode.name, err)
			}
			secs = append(secs, s)
			mode.prepare()
			start := time.Now()
			copy(c.region.Mem, src.Mem)
			copies = append(copies, time.Since(start).Seconds())
		}
		load, mem := benchproc.Median(secs), benchproc.Median(copies)
		fmt.Printf("multisource: same host (shm) %dx%dMiB, %s region: %.2f GB/s (load %.3f s); memcpy %.2f GB/s; time ÷ memcpy %.2f; the producer is refused %s\n",
			c.p.rows, c.p.rowMiB, mode.name, c.bytes()/load/1e9, load, c.bytes()/mem/1e9, load/mem, strings.Join(noptrace.Refused, ", "))
	}
	if got, want := t.Stats().Paths["shm"].Loads-before, int64(2*c.p.iters); got != want {
		return fmt.Errorf("same host: %d of %d loads went over shm (stats %+v)", got, want, t.Stats().Paths)
	}
	return nil
}

// dropPages frees the region's pages (its file's, in every process that
// maps it), so the next writer faults fresh zeroed pages in, as it does in a
// region no one has written since the engine started.
func dropPages(r data.Region) {
	if err := unix.Madvise(r.Mem, unix.MADV_REMOVE); err != nil {
		panic(fmt.Sprintf("madvise(MADV_REMOVE): %v", err))
	}
}

// pull looks the whole prompt up at the sources, then times its load.
func pull(t *tier.Tier, req string, srcs []*producer, keys [][]byte, slots []int64, job int64) (float64, error) {
	urls := make([]string, len(srcs))
	for i, pr := range srcs {
		urls[i] = fmt.Sprintf("%q", fmt.Sprintf("tcp://127.0.0.1:%d", pr.port))
	}
	if _, err := t.StartRequest(req, []byte(`{"remote_kv_source":[`+strings.Join(urls, ",")+`]}`)); err != nil {
		return 0, err
	}
	defer t.FinishRequest(req)
	res := make([]tier.LookupResult, len(keys))
	deadline := time.Now().Add(settleBound)
	// With the sessions open, each source answers the first lookup with one
	// frame; the load waits for all of them so it can spread over every
	// source (a HIT itself does not wait for slower sources).
	answers := t.Stats().FramesIn + int64(len(srcs))
	for {
		if err := t.Lookup(req, keys, res); err != nil {
			return 0, err
		}
		if err := t.OnScheduleEnd(); err != nil {
			return 0, err
		}
		if !slices.Contains(res, tier.Retry) && t.Stats().FramesIn >= answers {
			break
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("lookups still RETRY after %v", settleBound)
		}
		time.Sleep(time.Millisecond)
	}
	if i := slices.IndexFunc(res, func(r tier.LookupResult) bool { return r != tier.Hit }); i >= 0 {
		return 0, fmt.Errorf("key %d: %v, want HIT", i, res[i])
	}
	start := time.Now()
	if err := t.SubmitLoad(req, job, keys, slots); err != nil {
		return 0, err
	}
	for time.Since(start) < settleBound {
		for _, r := range t.GetFinished(16) {
			if r.JobID != job {
				continue
			}
			if !r.Success {
				return 0, fmt.Errorf("load job %d failed", job)
			}
			return time.Since(start).Seconds(), nil
		}
		time.Sleep(100 * time.Microsecond)
	}
	return 0, fmt.Errorf("load job %d not reported within %v", job, settleBound)
}

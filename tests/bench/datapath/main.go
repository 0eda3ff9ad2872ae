// Command datapath measures peerkv's data paths (tcpdata, NIXL when it
// loads, and the same-host path shmdata) between two processes on loopback against single-thread memcpy, in
// the same run.
//
// The program re-executes itself as the receiver (env childEnv set): the
// child maps its region (a memfd, as shmdata needs a file-backed region), prints its TCP data address, its
// same-host offer and its NIXL agent metadata, and on "verify <crc>" checks what arrived. The parent writes
// every row to the child -iters times per path and prints, e.g.:
//
//	datapath: tcp 256x2MiB: 3.1 GB/s; memcpy 1-thread: 9.8 GB/s; ratio 0.32
//	datapath: nixl 256x2MiB: 4.9 GB/s; memcpy 1-thread: 9.8 GB/s; ratio 0.50
//	verified
//	datapath: shm 256x2MiB: 9.1 GB/s; memcpy 1-thread: 9.8 GB/s; ratio 0.93
//	verified
//	datapath: raw TCP floor (2 plain loopback connections, ...): 3.4 GB/s; ratio to memcpy 0.35; tcp ÷ floor 0.91
//
// Figures are medians; GB is 10^9 bytes. NIXL is searched in -python-prefix
// (default: the repository's .venv) like the library does.
package main

import (
	"bufio"
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/data/shmdata"
	"github.com/peerkv/peerkv/core/data/tcpdata"
	"github.com/peerkv/peerkv/nixl"
	"github.com/peerkv/peerkv/tests/bench/internal/benchproc"
)

const (
	childEnv     = "PEERKV_DATAPATH_CHILD"
	childTimeout = 20 * time.Second // bound on any wait for the child
	ioTimeout    = 10 * time.Second
)

type params struct {
	rows, rowMiB, iters, streams, sockBuf int
	pythonPrefix                          string
}

func main() {
	var p params
	flag.IntVar(&p.rows, "rows", 256, "rows per transfer")
	flag.IntVar(&p.rowMiB, "row-mib", 2, "row size in MiB")
	flag.IntVar(&p.iters, "iters", 5, "measured iterations (median reported)")
	flag.IntVar(&p.streams, "streams", tcpdata.DefaultStreams, "TCP connections per peer")
	flag.IntVar(&p.sockBuf, "sockbuf", 0, "SO_SNDBUF/SO_RCVBUF bytes (0 = kernel autotuning)")
	flag.StringVar(&p.pythonPrefix, "python-prefix", ".venv", "Python environment holding the nixl wheels and vLLM (upstream baseline)")
	flag.Parse()

	var err error
	if os.Getenv(childEnv) != "" {
		err = runChild(p)
	} else {
		err = runParent(p)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "datapath:", err)
		os.Exit(1)
	}
}

// region maps the rows outside the Go heap, as a host's region is.
func (p params) region() (data.Region, error) {
	return benchproc.Region("peerkv-datapath", p.rows, uint64(p.rowMiB)<<20)
}

func (p params) shm(id string, region data.Region) (*shmdata.Transport, error) {
	return shmdata.New(shmdata.Options{
		Region: region, LocalID: id, TransferTimeout: ioTimeout,
		Logf: func(format string, args ...any) { fmt.Fprintf(os.Stderr, id+": "+format+"\n", args...) },
	})
}

func (p params) tcp(id string, region data.Region) (data.Transport, error) {
	return tcpdata.New(tcpdata.Options{
		LocalID: id, Region: region, ListenHost: "127.0.0.1",
		IOTimeout: ioTimeout, Streams: p.streams, SocketBufferBytes: p.sockBuf,
		Logf: func(format string, args ...any) { fmt.Fprintf(os.Stderr, id+": "+format+"\n", args...) },
	})
}

// nixl starts the NIXL path, or says why it cannot here.
func (p params) nixl(region data.Region) (data.Transport, error) {
	prefix, _ := filepath.Abs(p.pythonPrefix)
	return nixl.New(nixl.Options{Region: region, SearchPrefixes: []string{prefix}, TransferTimeout: ioTimeout})
}

// runChild receives rows until stdin closes, answering "verify <crc>".
func runChild(p params) error {
	region, err := p.region()
	if err != nil {
		return err
	}
	tcp, err := p.tcp("child", region)
	if err != nil {
		return err
	}
	defer tcp.Close()
	shm, err := p.shm("child", region)
	if err != nil {
		return err
	}
	defer shm.Close()
	fmt.Printf("addr %s base %d shm %s\n", tcp.DataAddr(), region.BaseAddr(), shm.Offer("parent"))
	if nx, err := p.nixl(region); err != nil {
		fmt.Printf("nixl-unavailable %s\n", strings.ReplaceAll(err.Error(), "\n", " "))
	} else {
		defer nx.Close()
		fmt.Printf("nixl %s\n", base64.StdEncoding.EncodeToString(nx.AgentMetadata()))
	}
	raw, err := serveRawTCP(region)
	if err != nil {
		return err
	}
	fmt.Printf("raw %s\n", raw)

	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		want, ok := strings.CutPrefix(in.Text(), "verify ")
		if !ok {
			return fmt.Errorf("child: unknown command %q", in.Text())
		}
		got := strconv.FormatUint(uint64(crc32.Checksum(region.Mem, crcTable)), 16)
		if got == want {
			fmt.Println("verified")
		} else {
			fmt.Printf("mismatch: crc %s, expected %s\n", got, want)
		}
		clear(region.Mem) // the next path must deliver every byte again
	}
	return in.Err()
}

var crcTable = crc32.MakeTable(crc32.Castagnoli)

func runParent(p params) error {
	src, err := p.region()
	if err != nil {
		return err
	}
	fillRandom(src.Mem)
	want := strconv.FormatUint(uint64(crc32.Checksum(src.Mem, crcTable)), 16)

	ch, err := benchproc.Start(childTimeout, childEnv+"=1")
	if err != nil {
		return fmt.Errorf("start child: %w", err)
	}
	defer ch.Stop()
	info := data.PeerInfo{NumRows: src.NumRows(), RowLen: src.RowLen}
	line, err := ch.ReadLine()
	if err != nil {
		return err
	}
	addrs, offer, found := strings.Cut(line, " shm ")
	if _, err := fmt.Sscanf(addrs, "addr %s base %d", &info.DataAddr, &info.BaseAddr); err != nil || !found {
		return fmt.Errorf("child said %q, expected its addresses and same-host offer: %v", line, err)
	}
	info.SameHost = offer
	if line, err = ch.ReadLine(); err != nil {
		return err
	}
	nixlWhy := ""
	if why, unavailable := strings.CutPrefix(line, "nixl-unavailable "); unavailable {
		nixlWhy = why
	} else if md, found := strings.CutPrefix(line, "nixl "); !found {
		return fmt.Errorf("child said %q, expected its NIXL metadata", line)
	} else if info.AgentMetadata, err = base64.StdEncoding.DecodeString(md); err != nil {
		return fmt.Errorf("child's NIXL metadata: %w", err)
	}

	if line, err = ch.ReadLine(); err != nil {
		return err
	}
	rawAddr, found := strings.CutPrefix(line, "raw ")
	if !found {
		return fmt.Errorf("child said %q, expected its raw TCP address", line)
	}

	mem := benchproc.Median(measureMemcpy(src.Mem, p.iters))
	rates := map[string]float64{}
	paths := []struct {
		name string
		open func() (data.Transport, error)
	}{
		{"tcp", func() (data.Transport, error) { return p.tcp("parent", src) }},
		{"nixl", func() (data.Transport, error) { return p.nixl(src) }},
		{"shm", func() (data.Transport, error) { return p.shm("parent", src) }},
	}
	for _, path := range paths {
		if path.name == "nixl" && nixlWhy != "" {
			fmt.Printf("datapath: nixl: not measured: %s\n", nixlWhy)
			continue
		}
		rate, err := measurePath(path.open, info, p)
		if err != nil {
			return fmt.Errorf("%s: %w", path.name, err)
		}
		rates[path.name] = rate
		fmt.Printf("datapath: %s %dx%dMiB: %.2f GB/s; memcpy 1-thread: %.2f GB/s; ratio %.2f\n",
			path.name, p.rows, p.rowMiB, rate, mem, rate/mem)
		if err := verify(ch, want); err != nil {
			return fmt.Errorf("%s: %w", path.name, err)
		}
		fmt.Println("verified")
	}
	raw, err := measureRawTCP(rawAddr, src.Mem, p)
	if err != nil {
		return err
	}
	fmt.Printf("datapath: raw TCP floor (%d plain loopback connections, writev from the region, read into the child's): %.2f GB/s; ratio to memcpy %.2f; tcp ÷ floor %.2f\n",
		max(1, p.streams), raw, raw/mem, rates["tcp"]/raw)
	if err := verify(ch, want); err != nil {
		return fmt.Errorf("raw TCP: %w", err)
	}
	ch.Stop() // its region is not needed for the upstream run
	compareWithUpstream(p, rates)
	return nil
}

// compareWithUpstream runs stock vLLM's NixlTransport on the same rows
// (tests/bench/upstream_nixl.py) and prints each of our paths over it.
func compareWithUpstream(p params, ours map[string]float64) {
	python := filepath.Join(p.pythonPrefix, "bin", "python")
	if _, err := os.Stat(python); err != nil {
		fmt.Printf("datapath: upstream not measured: %s missing\n", python)
		return
	}
	out, err := exec.Command(python, "tests/bench/upstream_nixl.py",
		strconv.Itoa(p.rows), strconv.Itoa(p.rowMiB), strconv.Itoa(p.iters)).Output()
	var reply struct{ Line string }
	if err != nil || json.Unmarshal(out, &reply) != nil {
		fmt.Printf("datapath: upstream not measured: %v %s\n", err, out)
		return
	}
	fmt.Println("datapath:", reply.Line)
	var upstream float64
	if _, err := fmt.Sscanf(reply.Line[strings.Index(reply.Line, ": ")+2:], "%f GB/s", &upstream); err != nil || upstream <= 0 {
		return
	}
	for _, name := range []string{"shm", "nixl", "tcp"} {
		if r, ok := ours[name]; ok {
			fmt.Printf("datapath: ours ÷ upstream: %s %.2f\n", name, r/upstream)
		}
	}
}

// measurePath writes every row to the child -iters times, after one warm-up
// transfer that faults in the child's pages and opens connections, and
// returns the median rate in GB/s.
func measurePath(open func() (data.Transport, error), info data.PeerInfo, p params) (float64, error) {
	tr, err := open()
	if err != nil {
		return 0, err
	}
	defer tr.Close()
	if err := tr.AddPeer("child", info); err != nil {
		return 0, err
	}
	rows := make([]uint64, p.rows)
	for i := range rows {
		rows[i] = uint64(i)
	}
	total := float64(uint64(p.rows) * info.RowLen)
	rates := make([]float64, 0, p.iters)
	for i := 0; i <= p.iters; i++ {
		start := time.Now()
		if err := writeAll(tr, rows); err != nil {
			return 0, fmt.Errorf("iteration %d: %w", i, err)
		}
		if i > 0 {
			rates = append(rates, total/time.Since(start).Seconds()/1e9)
		}
	}
	return benchproc.Median(rates), nil
}

// verify asks the child to compare its region's checksum with want.
func verify(c *benchproc.Child, want string) error {
	if err := c.Println("verify " + want); err != nil {
		return fmt.Errorf("ask child to verify: %w", err)
	}
	answer, err := c.ReadLine()
	if err != nil {
		return err
	}
	if answer != "verified" {
		return fmt.Errorf("child: %s", answer)
	}
	return nil
}

// writeAll sends rows to the child's same rows and waits for the outcome.
func writeAll(tr data.Transport, rows []uint64) error {
	id, err := tr.Write("child", rows, rows)
	if err != nil {
		return err
	}
	select {
	case c := <-tr.Completions():
		if c.ID != id {
			return fmt.Errorf("completion of transfer %d while %d was pending", c.ID, id)
		}
		return c.Err
	case <-time.After(childTimeout):
		return fmt.Errorf("transfer %d not done within %v", id, childTimeout)
	}
}

// measureMemcpy times copy() of src into a second buffer, after one warm-up
// copy that faults the destination in.
func measureMemcpy(src []byte, iters int) []float64 {
	dst := make([]byte, len(src))
	copy(dst, src)
	rates := make([]float64, 0, iters)
	for range iters {
		start := time.Now()
		copy(dst, src)
		rates = append(rates, float64(len(src))/time.Since(start).Seconds()/1e9)
	}
	return rates
}

func fillRandom(b []byte) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], rng.Uint64())
	}
}

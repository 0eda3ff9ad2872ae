// Command datapath measures the tcpdata data path between two processes on
// loopback against single-thread memcpy, in the same run.
//
// The program re-executes itself as the receiver (env childEnv set): the
// child allocates its region, prints its data address, and on "verify
// <crc>" checks what arrived. The parent writes every row to the child
// -iters times and prints, e.g.:
//
//	datapath: tcp 256x2MiB: 3.1 GB/s; memcpy 1-thread: 9.8 GB/s; ratio 0.32
//	verified
//
// Figures are medians; GB is 10^9 bytes.
package main

import (
	"bufio"
	"encoding/binary"
	"flag"
	"fmt"
	"hash/crc32"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/data/tcpdata"
)

const (
	childEnv     = "PEERKV_DATAPATH_CHILD"
	childTimeout = 20 * time.Second // bound on any wait for the child
	ioTimeout    = 10 * time.Second
)

type params struct {
	rows, rowMiB, iters, streams, sockBuf int
}

func main() {
	var p params
	flag.IntVar(&p.rows, "rows", 256, "rows per transfer")
	flag.IntVar(&p.rowMiB, "row-mib", 2, "row size in MiB")
	flag.IntVar(&p.iters, "iters", 5, "measured iterations (median reported)")
	flag.IntVar(&p.streams, "streams", tcpdata.DefaultStreams, "TCP connections per peer")
	flag.IntVar(&p.sockBuf, "sockbuf", 0, "SO_SNDBUF/SO_RCVBUF bytes (0 = kernel autotuning)")
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

func (p params) region() data.Region {
	rowLen := uint64(p.rowMiB) << 20
	return data.Region{Mem: make([]byte, uint64(p.rows)*rowLen), RowLen: rowLen}
}

func (p params) transport(id string, region data.Region) (*tcpdata.Transport, error) {
	return tcpdata.New(tcpdata.Options{
		LocalID: id, Region: region, ListenHost: "127.0.0.1",
		IOTimeout: ioTimeout, Streams: p.streams, SocketBufferBytes: p.sockBuf,
		Logf: func(format string, args ...any) { fmt.Fprintf(os.Stderr, id+": "+format+"\n", args...) },
	})
}

// runChild receives rows until stdin closes, answering "verify <crc>".
func runChild(p params) error {
	region := p.region()
	tr, err := p.transport("child", region)
	if err != nil {
		return err
	}
	defer tr.Close()
	fmt.Printf("addr %s\n", tr.DataAddr())

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
	}
	return in.Err()
}

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// child is the receiver process, driven over its stdin and stdout.
type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
}

func startChild() (*child, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, os.Args[1:]...)
	cmd.Env = append(os.Environ(), childEnv+"=1")
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
	c := &child{cmd: cmd, stdin: stdin, lines: make(chan string, 4)}
	go func() {
		defer close(c.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.lines <- sc.Text()
		}
	}()
	return c, nil
}

func (c *child) readLine() (string, error) {
	select {
	case line, ok := <-c.lines:
		if !ok {
			return "", fmt.Errorf("child exited early")
		}
		return line, nil
	case <-time.After(childTimeout):
		return "", fmt.Errorf("child silent for %v", childTimeout)
	}
}

// stop closes the child's stdin and waits for it, killing it if it hangs.
func (c *child) stop() {
	_ = c.stdin.Close()
	done := make(chan struct{})
	go func() { _ = c.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(childTimeout):
		_ = c.cmd.Process.Kill()
		<-done
	}
}

func runParent(p params) error {
	src := p.region()
	fillRandom(src.Mem)
	totalBytes := float64(len(src.Mem))

	ch, err := startChild()
	if err != nil {
		return fmt.Errorf("start child: %w", err)
	}
	defer ch.stop()
	line, err := ch.readLine()
	if err != nil {
		return err
	}
	addr, ok := strings.CutPrefix(line, "addr ")
	if !ok {
		return fmt.Errorf("child said %q, expected its address", line)
	}

	tr, err := p.transport("parent", src)
	if err != nil {
		return err
	}
	defer tr.Close()
	if err := tr.AddPeer("child", data.PeerInfo{NumRows: src.NumRows(), RowLen: src.RowLen, DataAddr: addr}); err != nil {
		return err
	}

	rows := make([]uint64, p.rows)
	for i := range rows {
		rows[i] = uint64(i)
	}
	// One warm-up transfer faults in the child's pages and opens connections.
	tcpRates := make([]float64, 0, p.iters)
	for i := 0; i <= p.iters; i++ {
		start := time.Now()
		if err := writeAll(tr, rows); err != nil {
			return fmt.Errorf("iteration %d: %w", i, err)
		}
		if i > 0 {
			tcpRates = append(tcpRates, totalBytes/time.Since(start).Seconds()/1e9)
		}
	}

	memRates := measureMemcpy(src.Mem, p.iters)
	tcp, mem := median(tcpRates), median(memRates)
	fmt.Printf("datapath: tcp %dx%dMiB: %.2f GB/s; memcpy 1-thread: %.2f GB/s; ratio %.2f\n",
		p.rows, p.rowMiB, tcp, mem, tcp/mem)

	want := strconv.FormatUint(uint64(crc32.Checksum(src.Mem, crcTable)), 16)
	if _, err := fmt.Fprintf(ch.stdin, "verify %s\n", want); err != nil {
		return fmt.Errorf("ask child to verify: %w", err)
	}
	answer, err := ch.readLine()
	if err != nil {
		return err
	}
	if answer != "verified" {
		return fmt.Errorf("child: %s", answer)
	}
	fmt.Println("verified")
	return nil
}

// writeAll sends rows to the child's same rows and waits for the outcome.
func writeAll(tr *tcpdata.Transport, rows []uint64) error {
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

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

package main

// The loopback TCP floor: the same bytes over the same number of plain TCP
// connections, written straight from the region with writev and read
// straight into the child's region, with no protocol, no checks and one
// ack per part. tcpdata's rate over this floor is what our protocol costs;
// this floor over memcpy is what the kernel's loopback costs on the host.

import (
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"time"

	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/tests/bench/internal/benchproc"
)

const rawHeaderLen = 16 // offset u64 | length u64

// serveRawTCP accepts connections and copies each part into region.Mem at
// its offset, acking every part with one byte. It returns the address.
func serveRawTCP(region data.Region) (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go sinkRawParts(conn, region.Mem)
		}
	}()
	return ln.Addr().String(), nil
}

func sinkRawParts(conn net.Conn, mem []byte) {
	defer conn.Close()
	var hdr [rawHeaderLen]byte
	for {
		_ = conn.SetDeadline(time.Now().Add(ioTimeout))
		if _, err := io.ReadFull(conn, hdr[:]); err != nil {
			return
		}
		off, n := binary.LittleEndian.Uint64(hdr[:]), binary.LittleEndian.Uint64(hdr[8:])
		if off > uint64(len(mem)) || n > uint64(len(mem))-off {
			fmt.Fprintf(os.Stderr, "child: raw part %d+%d outside the region\n", off, n)
			return
		}
		if _, err := io.ReadFull(conn, mem[off:off+n]); err != nil {
			return
		}
		if _, err := conn.Write([]byte{1}); err != nil {
			return
		}
	}
}

// measureRawTCP sends all of src to addr over streams connections, one part
// of consecutive bytes each, -iters times after a warm-up, and returns the
// median rate in GB/s.
func measureRawTCP(addr string, src []byte, p params) (float64, error) {
	streams := max(1, p.streams)
	conns := make([]net.Conn, streams)
	for i := range conns {
		c, err := net.DialTimeout("tcp", addr, ioTimeout)
		if err != nil {
			return 0, err
		}
		defer c.Close()
		conns[i] = c
	}
	part := (uint64(len(src)) + uint64(streams) - 1) / uint64(streams)
	rates := make([]float64, 0, p.iters)
	for i := 0; i <= p.iters; i++ {
		start := time.Now()
		errs := make([]error, streams)
		var wg sync.WaitGroup
		for s, c := range conns {
			off := min(uint64(s)*part, uint64(len(src)))
			end := min(off+part, uint64(len(src)))
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[s] = sendRawPart(c, src[off:end], off)
			}()
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				return 0, fmt.Errorf("raw TCP iteration %d: %w", i, err)
			}
		}
		if i > 0 {
			rates = append(rates, float64(len(src))/time.Since(start).Seconds()/1e9)
		}
	}
	return benchproc.Median(rates), nil
}

func sendRawPart(c net.Conn, b []byte, off uint64) error {
	var hdr [rawHeaderLen]byte
	binary.LittleEndian.PutUint64(hdr[:], off)
	binary.LittleEndian.PutUint64(hdr[8:], uint64(len(b)))
	_ = c.SetDeadline(time.Now().Add(childTimeout))
	bufs := net.Buffers{hdr[:], b}
	if _, err := bufs.WriteTo(c); err != nil {
		return err
	}
	var ack [1]byte
	_, err := io.ReadFull(c, ack[:])
	return err
}

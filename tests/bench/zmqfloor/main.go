// Command zmqfloor measures the bare control-plane round trip A→B→A on
// loopback, in one run, three ways:
//
//   - zmqctl: two zmqctl Transports in this process; B's consumer echoes
//     every frame back;
//   - zmqctl, 2 processes: the same with B in a child process, as two
//     engines are, and as the pyzmq baseline runs;
//   - zmqctl, 2 processes, handed: the same with each side taking frames
//     on its transport's goroutine (control.Handing), as the tier does: A
//     times the echo and sends the next frame from there (the ratio to
//     pyzmq the goal is judged by is this case's);
//   - raw: the same topology (each side a bound ROUTER plus a DEALER to the
//     other, as vLLM's zmq.py) on pebbe/zmq4 sockets read with blocking
//     receives on dedicated goroutines: the floor for Go over libzmq;
//   - pyzmq: the same topology in two Python processes (the baseline the
//     tier is compared with), when the Python given by -python imports zmq.
//
// Then the zmqctl case again with -peers DEALERs open on A (idle peers that
// never send): a message must cost the same with 1 or 64 peers. Prints p50
// and p99 of each and the ratios, e.g.:
//
//	zmqfloor: zmqctl round trip (256 B): p50 80µs; p99 200µs
//	zmqfloor: ratios p50 (p99): zmqctl/raw 1.10 (1.20); zmqctl (2 processes)/pyzmq 1.30 (1.40)
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/peerkv/peerkv/core/control"
	"github.com/peerkv/peerkv/core/control/zmqctl"
	"github.com/peerkv/peerkv/tests/bench/internal/benchproc"
)

const (
	frameLen  = 256 // a typical msgpack control message
	warmup    = 200
	waitBound = 5 * time.Second
)

// echoChildEnv marks the child that runs B of the two-process case.
const echoChildEnv = "PEERKV_ZMQFLOOR_ECHO"

func main() {
	if os.Getenv(echoChildEnv) != "" {
		if err := runEchoChild(); err != nil {
			fmt.Fprintln(os.Stderr, "zmqfloor child:", err)
			os.Exit(1)
		}
		return
	}
	rounds := flag.Int("rounds", 5000, "round trips to time per case")
	peers := flag.Int("peers", 64, "DEALERs open on A in the many-peers case (0 skips it)")
	python := flag.String("python", ".venv/bin/python", "Python with pyzmq for the baseline (\"\" skips it)")
	flag.Parse()
	if err := run(*rounds, *peers, *python); err != nil {
		fmt.Fprintln(os.Stderr, "zmqfloor:", err)
		os.Exit(1)
	}
}

type result struct{ p50, p99 time.Duration }

func (r result) String() string {
	return fmt.Sprintf("p50 %v; p99 %v", r.p50.Round(time.Microsecond), r.p99.Round(time.Microsecond))
}

func summarize(lat []time.Duration) result {
	slices.Sort(lat)
	q := func(f float64) time.Duration { return lat[int(f*float64(len(lat)-1))] }
	return result{q(0.50), q(0.99)}
}

func run(rounds, peers int, python string) error {
	zc, err := benchZmqctl(rounds, 0)
	if err != nil {
		return fmt.Errorf("zmqctl: %w", err)
	}
	fmt.Printf("zmqfloor: zmqctl round trip (%d B): %v\n", frameLen, zc)
	zc2, err := benchZmqctlTwoProcesses(rounds)
	if err != nil {
		return fmt.Errorf("zmqctl, 2 processes: %w", err)
	}
	fmt.Printf("zmqfloor: zmqctl round trip, 2 processes: %v\n", zc2)
	zh, err := benchZmqctlTwoProcessesHanded(rounds)
	if err != nil {
		return fmt.Errorf("zmqctl handed, 2 processes: %w", err)
	}
	fmt.Printf("zmqfloor: zmqctl round trip, 2 processes, frames handed (as the tier takes them): %v\n", zh)
	raw, err := benchRaw(rounds)
	if err != nil {
		return fmt.Errorf("raw: %w", err)
	}
	fmt.Printf("zmqfloor: raw pebbe DEALER/ROUTER round trip, blocking recv: %v\n", raw)
	var py *result
	if python != "" {
		r, err := benchPyzmq(python, rounds, "two")
		if err != nil {
			fmt.Printf("zmqfloor: pyzmq baseline skipped: %v\n", err)
		} else {
			py = &r
			fmt.Printf("zmqfloor: pyzmq DEALER/ROUTER round trip (2 processes, same topology): %v\n", r)
			if one, err := benchPyzmq(python, rounds, "one"); err == nil {
				fmt.Printf("zmqfloor: pyzmq DEALER->ROUTER echo on one connection: %v\n", one)
			}
		}
	}
	if peers > 1 {
		many, err := benchZmqctl(rounds, peers-1)
		if err != nil {
			return fmt.Errorf("zmqctl with %d peers: %w", peers, err)
		}
		fmt.Printf("zmqfloor: zmqctl round trip with %d peers open: %v\n", peers, many)
	}
	ratio := func(a, b result) string {
		return fmt.Sprintf("%.2f (%.2f)", float64(a.p50)/float64(b.p50), float64(a.p99)/float64(b.p99))
	}
	line := "zmqfloor: ratios p50 (p99): zmqctl/raw " + ratio(zc, raw)
	if py != nil {
		line += "; zmqctl handed (2 processes)/pyzmq " + ratio(zh, *py) +
			"; zmqctl (2 processes)/pyzmq " + ratio(zc2, *py) + "; zmqctl (1 process)/pyzmq " + ratio(zc, *py) +
			"; raw (1 process)/pyzmq " + ratio(raw, *py)
	}
	fmt.Println(line)
	return nil
}

func newTransport() (*zmqctl.Transport, error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	var err error
	for range 20 {
		port, perr := benchproc.FreePort()
		if perr != nil {
			return nil, perr
		}
		var t *zmqctl.Transport
		t, err = zmqctl.New(fmt.Sprintf("127.0.0.1:%d", port), "127.0.0.1", port, zmqctl.Options{Logger: quiet})
		if err == nil {
			return t, nil
		}
		if !strings.Contains(err.Error(), "in use") {
			return nil, err
		}
	}
	return nil, err
}

// benchZmqctl times A.Send → B echoes → A's Events, with extra idle peers
// (bare ROUTERs that A dials) open on A.
func benchZmqctl(rounds, extra int) (result, error) {
	a, err := newTransport()
	if err != nil {
		return result{}, err
	}
	defer a.Close()
	b, err := newTransport()
	if err != nil {
		return result{}, err
	}
	defer b.Close()
	go func() {
		for ev := range b.Events() {
			if ev.Kind == control.EventFrame {
				_ = b.Send(ev.PeerID, ev.Frame)
			}
		}
	}()
	if extra > 0 {
		ctx, err := zmq.NewContext()
		if err != nil {
			return result{}, err
		}
		defer ctx.Term()
		for range extra {
			s, err := ctx.NewSocket(zmq.ROUTER)
			if err != nil {
				return result{}, err
			}
			_ = s.SetLinger(0)
			defer s.Close()
			port, err := bindEphemeral(s)
			if err != nil {
				return result{}, err
			}
			if err := a.Connect(fmt.Sprintf("127.0.0.1:%d", port)); err != nil {
				return result{}, err
			}
		}
	}
	return timeEchoes(a, b.LocalID(), rounds)
}

// timeEchoes times rounds of a.Send to peer and the echo's arrival.
func timeEchoes(a *zmqctl.Transport, peer string, rounds int) (result, error) {
	frame := make([]byte, frameLen)
	timer := time.NewTimer(waitBound)
	defer timer.Stop()
	roundTrip := func() error {
		if err := a.Send(peer, frame); err != nil {
			return err
		}
		timer.Reset(waitBound)
		for {
			select {
			case ev, ok := <-a.Events():
				if !ok {
					return errors.New("events closed")
				}
				if ev.Kind == control.EventFrame {
					return nil
				}
				return fmt.Errorf("unexpected event %v: %v", ev.Kind, ev.Err)
			case <-timer.C:
				return errors.New("round trip timed out")
			}
		}
	}
	return timeRounds(rounds, roundTrip)
}

// benchZmqctlTwoProcesses times A in this process against B's echo in a
// child process.
func benchZmqctlTwoProcesses(rounds int) (result, error) {
	a, peer, stop, err := startEchoChild("1")
	if err != nil {
		return result{}, err
	}
	defer stop()
	return timeEchoes(a, peer, rounds)
}

// startEchoChild starts B in a child process (mode: its echoChildEnv
// value) and A here; stop ends both.
func startEchoChild(mode string) (a *zmqctl.Transport, peer string, stop func(), err error) {
	child, err := benchproc.Start(waitBound, echoChildEnv+"="+mode)
	if err != nil {
		return nil, "", nil, err
	}
	if peer, err = child.ReadLine(); err == nil {
		a, err = newTransport()
	}
	if err != nil {
		child.Stop()
		return nil, "", nil, err
	}
	return a, peer, func() { _ = a.Close(); child.Stop() }, nil
}

// benchZmqctlTwoProcessesHanded is the two-process case with frames
// handed to a function on each transport's own goroutine (control.Handing),
// as the tier takes them: A's function times the echo and sends the next
// frame, B's echoes.
func benchZmqctlTwoProcessesHanded(rounds int) (result, error) {
	a, peer, stop, err := startEchoChild("handed")
	if err != nil {
		return result{}, err
	}
	defer stop()
	frame := make([]byte, frameLen)
	lat := make([]time.Duration, 0, rounds)
	done := make(chan error, 1)
	var sent time.Time
	n := 0
	next := func() {
		sent = time.Now()
		if err := a.Send(peer, frame); err != nil {
			done <- err
		}
	}
	a.Hand(func(ev control.Event) {
		if ev.Kind != control.EventFrame {
			done <- fmt.Errorf("unexpected event %v: %v", ev.Kind, ev.Err)
			return
		}
		if n >= warmup {
			lat = append(lat, time.Since(sent))
		}
		if n++; n == warmup+rounds {
			done <- nil
			return
		}
		next()
	})
	next()
	select {
	case err := <-done:
		if err != nil {
			return result{}, err
		}
		return summarize(lat), nil
	case <-time.After(waitBound + time.Duration(warmup+rounds)*10*time.Millisecond):
		return result{}, errors.New("round trips timed out")
	}
}

// runEchoChild is B of the two-process cases: it prints its peer id, echoes
// every frame to its sender (from Events, or handed when its environment
// says "handed") and exits when stdin closes.
func runEchoChild() error {
	b, err := newTransport()
	if err != nil {
		return err
	}
	defer b.Close()
	echo := func(ev control.Event) {
		if ev.Kind == control.EventFrame {
			_ = b.Send(ev.PeerID, ev.Frame)
		}
	}
	if os.Getenv(echoChildEnv) == "handed" {
		b.Hand(echo)
	} else {
		go func() {
			for ev := range b.Events() {
				echo(ev)
			}
		}()
	}
	fmt.Println(b.LocalID())
	_, _ = io.Copy(io.Discard, os.Stdin)
	return nil
}

func bindEphemeral(s *zmq.Socket) (int, error) {
	if err := s.Bind("tcp://127.0.0.1:*"); err != nil {
		return 0, err
	}
	ep, err := s.GetLastEndpoint()
	if err != nil {
		return 0, err
	}
	_, port, err := net.SplitHostPort(strings.TrimPrefix(ep, "tcp://"))
	if err != nil {
		return 0, err
	}
	var n int
	_, err = fmt.Sscan(port, &n)
	return n, err
}

func timeRounds(rounds int, roundTrip func() error) (result, error) {
	for range warmup {
		if err := roundTrip(); err != nil {
			return result{}, err
		}
	}
	lat := make([]time.Duration, rounds)
	for i := range lat {
		start := time.Now()
		if err := roundTrip(); err != nil {
			return result{}, err
		}
		lat[i] = time.Since(start)
	}
	return summarize(lat), nil
}

// side is one raw peer: its bound ROUTER and its DEALER to the other.
type side struct {
	id             string
	router, dealer *zmq.Socket
}

func newSide(ctx *zmq.Context) (*side, error) {
	r, err := ctx.NewSocket(zmq.ROUTER)
	if err != nil {
		return nil, err
	}
	_ = r.SetLinger(0)
	port, err := bindEphemeral(r)
	if err != nil {
		r.Close()
		return nil, err
	}
	return &side{id: fmt.Sprintf("127.0.0.1:%d", port), router: r}, nil
}

func (s *side) dial(ctx *zmq.Context, to *side) error {
	d, err := ctx.NewSocket(zmq.DEALER)
	if err != nil {
		return err
	}
	s.dealer = d
	_ = d.SetLinger(0)
	if err := d.SetIdentity(s.id); err != nil {
		return err
	}
	return d.Connect("tcp://" + to.id)
}

func (s *side) close() {
	for _, sock := range []*zmq.Socket{s.router, s.dealer} {
		if sock != nil {
			sock.Close()
		}
	}
}

// benchRaw times the raw round trip: A's goroutine sends on its DEALER and
// blocks on its ROUTER; B's echo goroutine blocks on its ROUTER and sends
// back on its DEALER. Each socket is used by one locked goroutine.
func benchRaw(rounds int) (result, error) {
	ctxA, err := zmq.NewContext()
	if err != nil {
		return result{}, err
	}
	ctxB, err := zmq.NewContext()
	if err != nil {
		return result{}, err
	}
	a, err := newSide(ctxA)
	if err != nil {
		return result{}, err
	}
	b, err := newSide(ctxB)
	if err != nil {
		return result{}, err
	}
	if err := a.dial(ctxA, b); err != nil {
		return result{}, err
	}
	if err := b.dial(ctxB, a); err != nil {
		return result{}, err
	}
	for _, s := range []*zmq.Socket{a.router, b.router} {
		_ = s.SetRcvtimeo(waitBound)
	}
	echoDone := make(chan struct{})
	go func() {
		defer close(echoDone)
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		for {
			msg, err := b.router.RecvMessageBytes(0)
			if err != nil || len(msg) != 2 || len(msg[1]) == 0 {
				return // timeout or the stop frame
			}
			if _, err := b.dealer.SendBytes(msg[1], 0); err != nil {
				return
			}
		}
	}()
	frame := bytes.Repeat([]byte{1}, frameLen)
	res, err := func() (result, error) {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		r, err := timeRounds(rounds, func() error {
			if _, err := a.dealer.SendBytes(frame, 0); err != nil {
				return err
			}
			msg, err := a.router.RecvMessageBytes(0)
			if err != nil {
				return err
			}
			if len(msg) != 2 {
				return fmt.Errorf("got %d frames", len(msg))
			}
			return nil
		})
		_, _ = a.dealer.SendBytes(nil, 0) // stop the echo
		return r, err
	}()
	<-echoDone
	a.close()
	b.close()
	_ = ctxA.Term()
	_ = ctxB.Term()
	return res, err
}

// pyzmqScript runs the raw topology in two Python processes: the echo in a
// child (the script again, with "echo"), the timing in the parent. The
// parent prints {"p50_us": .., "p99_us": ..}.
const pyzmqScript = `
import json, os, subprocess, sys, time, zmq

def bind(ctx):
    r = ctx.socket(zmq.ROUTER); r.linger = 0; r.rcvtimeo = 5000
    port = r.bind_to_random_port("tcp://127.0.0.1")
    return r, "127.0.0.1:%d" % port

def dealer(ctx, me, to):
    d = ctx.socket(zmq.DEALER); d.linger = 0
    d.setsockopt(zmq.IDENTITY, me.encode()); d.connect("tcp://" + to)
    return d

def echo(a_id):
    ctx = zmq.Context()
    r, me = bind(ctx)
    d = dealer(ctx, me, a_id) if a_id else None
    print(me, flush=True)
    while True:
        try:
            ident, payload = r.recv_multipart()
        except zmq.Again:
            return
        if not payload:
            return
        if d is None:
            r.send_multipart([ident, payload])  # one connection: reply on it
        else:
            d.send(payload)

def main(rounds, warmup, n, one):
    ctx = zmq.Context()
    r, me = bind(ctx)
    child = subprocess.Popen([sys.executable, "-c", SCRIPT, "echo", "" if one else me], stdout=subprocess.PIPE, text=True)
    d = dealer(ctx, me, child.stdout.readline().strip())
    if one:
        r = d
    frame = b"\x01" * n
    lat = []
    for i in range(warmup + rounds):
        t0 = time.perf_counter_ns()
        d.send(frame)
        r.recv_multipart()
        if i >= warmup:
            lat.append(time.perf_counter_ns() - t0)
    d.send(b"")
    child.wait(10)
    lat.sort()
    q = lambda f: lat[int(f * (len(lat) - 1))] / 1000.0
    print(json.dumps({"p50_us": q(0.50), "p99_us": q(0.99)}))

SCRIPT = os.environ["ZMQFLOOR_SCRIPT"]
if sys.argv[1] == "echo":
    echo(sys.argv[2])
else:
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4] == "one")
`

func benchPyzmq(python string, rounds int, topology string) (result, error) {
	if _, err := os.Stat(python); err != nil {
		if _, lerr := exec.LookPath(python); lerr != nil {
			return result{}, fmt.Errorf("no %s", python)
		}
	}
	cmd := exec.Command(python, "-c", pyzmqScript, fmt.Sprint(rounds), fmt.Sprint(warmup), fmt.Sprint(frameLen), topology)
	cmd.Env = append(os.Environ(), "ZMQFLOOR_SCRIPT="+pyzmqScript)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	timer := time.AfterFunc(2*time.Minute, func() {
		if cmd.Process != nil {
			_ = cmd.Process.Kill()
		}
	})
	defer timer.Stop()
	out, err := cmd.Output()
	if err != nil {
		return result{}, fmt.Errorf("%v: %s", err, strings.TrimSpace(lastLine(stderr.String())))
	}
	var r struct{ P50US, P99US float64 }
	if err := json.Unmarshal(bytes.TrimSpace(out), &struct {
		P50 *float64 `json:"p50_us"`
		P99 *float64 `json:"p99_us"`
	}{&r.P50US, &r.P99US}); err != nil {
		return result{}, fmt.Errorf("parse %q: %w", out, err)
	}
	us := func(f float64) time.Duration { return time.Duration(f * float64(time.Microsecond)) }
	return result{us(r.P50US), us(r.P99US)}, nil
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

package zmqctl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"time"

	zmq "github.com/pebbe/zmq4"

	"github.com/peerkv/peerkv/core/control"
)

// libzmq's monitor says only that a connection attempt closed, never why
// (the connect's errno stays inside libzmq), and says nothing at all of a
// host name that does not resolve: the attempt just never completes. So a
// connection that never came up is reported as a control.ConnectError with
// a guess, and Diagnose, which its owner runs off every lock, names the
// cause by trying the address itself.

var _ control.Diagnoser = (*Transport)(nil)

// connectFailure wraps err, a fatal monitor event, as a ConnectError when
// the DEALER never completed its handshake: a connect that failed (closed)
// or a TCP connection the peer ended before the handshake (disconnected).
func connectFailure(pc *peerConn, event zmq.Event, err error) error {
	if pc.deadline.IsZero() {
		return err // it was up: a lost connection, not a failed connect
	}
	if event&zmq.EVENT_CLOSED != 0 {
		return &control.ConnectError{Cause: control.CauseRefused, Unsure: true, Err: err}
	}
	return &control.ConnectError{Cause: control.CauseClosed, Err: err}
}

// Diagnose implements control.Diagnoser: it resolves the peer id's host
// when it is a name and opens (and at once closes) a TCP connection to it,
// naming why that fails.
func (t *Transport) Diagnose(peerID string, timeout time.Duration) (cause, detail string) {
	ep, err := parsePeerID(peerID)
	if err != nil {
		return control.CauseUnresolvable, err.Error()
	}
	hostPort := strings.TrimPrefix(ep.addr, "tcp://")
	host, _, _ := net.SplitHostPort(hostPort)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	if net.ParseIP(host) == nil {
		if _, err := lookupIPAddr(ctx, host); err != nil {
			return control.CauseUnresolvable, fmt.Sprintf("its host name %q does not resolve (%v): check the name "+
				"the orchestrator gives, and this host's DNS", host, err)
		}
	}
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", hostPort)
	if err == nil {
		_ = conn.Close()
		return "", ""
	}
	return dialFailure(err, timeout)
}

// dialFailure names the cause of a failed TCP connect.
func dialFailure(err error, timeout time.Duration) (cause, detail string) {
	var dnsErr *net.DNSError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return control.CauseRefused, "connection refused: nothing listens on that port (the engine is not " +
			"running, is still starting, or listens on another port)"
	case errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.EADDRNOTAVAIL):
		return control.CauseUnreachable, fmt.Sprintf("unreachable: %v (no route to that network or host: "+
			"check the address and this host's routes)", err)
	case errors.As(err, &dnsErr):
		return control.CauseUnresolvable, fmt.Sprintf("its host name does not resolve: %v", err)
	// A dial past its context's deadline fails with os.ErrDeadlineExceeded
	// ("i/o timeout"), not context.DeadlineExceeded.
	case errors.Is(err, os.ErrDeadlineExceeded), errors.Is(err, context.DeadlineExceeded), errors.Is(err, syscall.ETIMEDOUT):
		return control.CauseTimeout, fmt.Sprintf("no answer within %v: packets to it are dropped (a firewall, "+
			"a partition) or its host is down", timeout)
	}
	return control.CauseUnreachable, err.Error()
}

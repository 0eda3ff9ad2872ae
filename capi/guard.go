package main

/*
#include "peerkv.h"
*/
import "C"

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"sync/atomic"

	"github.com/peerkv/peerkv/core/tier"
)

// A panic inside the library leaves its state unknown: the first one is
// recovered, its goroutine stacks go to stderr once, and the library is
// poisoned so every later call fails fast instead of acting on bad state.
var (
	poisoned    atomic.Bool
	poisonCause atomic.Value // string: where and why the first panic happened
	stackOnce   sync.Once
)

// call carries one export's name and error buffer.
type call struct {
	fn     string
	errBuf *C.char
	errLen C.size_t
}

// enter is every export's preamble, in one place: the panic guard is
// deferred first, then begin refuses a poisoned library; body runs only
// after both. body never escapes, so an export's func literal stays on its
// stack (no allocation per call: go build -gcflags=-m ./capi says "func
// literal does not escape"); c is passed by value for the same reason.
func enter(fn string, errBuf *C.char, errLen C.size_t, body func(c call) C.int32_t) (rc C.int32_t) {
	c := call{fn: fn, errBuf: errBuf, errLen: errLen}
	defer c.guard(&rc)
	if rc = c.begin(); rc != statusOK {
		return rc
	}
	return body(c)
}

// enterNode is enter for the exports that take a handle: body gets the
// tier of the node h names, or never runs (PEERKV_ERR_UNKNOWN_HANDLE).
func enterNode(fn string, h C.peerkv_handle, errBuf *C.char, errLen C.size_t, body func(c call, t *tier.Tier) C.int32_t) (rc C.int32_t) {
	c := call{fn: fn, errBuf: errBuf, errLen: errLen}
	defer c.guard(&rc)
	if rc = c.begin(); rc != statusOK {
		return rc
	}
	nd, err := handles.get(int64(h))
	if err != nil {
		return c.fail(err, statusUnknownHandle)
	}
	return body(c, nd.tier)
}

// begin clears the error buffer and refuses work once poisoned; enter and
// enterNode call it right after deferring guard.
func (c *call) begin() C.int32_t {
	writeCString(c.errBuf, c.errLen, "")
	if poisoned.Load() {
		cause, _ := poisonCause.Load().(string)
		return c.failf(statusInternal, "libpeerkv is poisoned by an earlier panic (%s) and is in an unknown state; restart the process", cause)
	}
	panicPoint(c.fn)
	return statusOK
}

// guard is deferred first by enter and enterNode: it turns a panic into
// PEERKV_ERR_INTERNAL and poisons the library.
func (c *call) guard(rc *C.int32_t) {
	r := recover()
	if r == nil {
		return
	}
	cause := fmt.Sprintf("Go panic in %s: %v", c.fn, r)
	if poisoned.CompareAndSwap(false, true) {
		poisonCause.Store(cause)
	}
	stackOnce.Do(func() {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		fmt.Fprintf(os.Stderr, "libpeerkv: %s; the library is now poisoned\n%s\n", cause, buf)
	})
	*rc = c.failf(statusInternal, "%s (goroutine stacks on stderr); the library is now poisoned", cause)
}

// failf writes "<fn>: <message>" into the error buffer and returns code.
func (c *call) failf(code C.int32_t, format string, args ...any) C.int32_t {
	writeCString(c.errBuf, c.errLen, c.fn+": "+fmt.Sprintf(format, args...))
	return code
}

// fail reports err with the status it maps to (fallback if none).
func (c *call) fail(err error, fallback C.int32_t) C.int32_t {
	return c.failf(statusFor(err, fallback), "%v", err)
}

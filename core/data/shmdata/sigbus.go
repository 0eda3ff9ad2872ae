package shmdata

import (
	"unsafe"

	"golang.org/x/sys/unix"
)

// Which copy a transfer takes depends on who handles SIGBUS in this
// process, checked at each transfer.
//
// Go's own handler, installed when the runtime started, turns a fault on
// a mapping into a panic the copy recovers (debug.SetPanicOnFault), so a
// peer that shrinks its file mid-copy fails only its transfer: then rows
// are copied with memcpy into the mapping of the peer's rows, the fast
// path. A handler installed after ours (Python's faulthandler enabled by
// vLLM's watchdog once the engine has started, or any host's) receives
// the fault instead and ends the process, so then the kernel copies
// (pread into the mapping: a fault there is EFAULT, never a signal). A
// handler installed before ours (PYTHONFAULTHANDLER) is one Go forwards
// faults outside Go to; it leaves the fast path on.

// goSIGBUSHandler is the handler address Go's runtime installed for
// SIGBUS, read when this package is initialised (after the runtime set
// its handlers, before any host code could run ours over).
var goSIGBUSHandler = currentSIGBUSHandler()

// currentSIGBUSHandler reads the installed SIGBUS handler's address with
// rt_sigaction. The handler is the first word of the kernel's sigaction
// on every Linux architecture; the buffer is larger than any of them.
func currentSIGBUSHandler() uintptr {
	var old [8]uint64
	const sigsetBytes = 8
	if _, _, errno := unix.RawSyscall6(unix.SYS_RT_SIGACTION, uintptr(unix.SIGBUS), 0,
		uintptr(unsafe.Pointer(&old[0])), sigsetBytes, 0, 0); errno != 0 {
		return 0
	}
	return uintptr(old[0])
}

// goHandlesSIGBUS reports whether Go's handler is still the installed one,
// so that a fault in a copy is recovered rather than fatal.
func goHandlesSIGBUS() bool {
	return goSIGBUSHandler > 1 && currentSIGBUSHandler() == goSIGBUSHandler // 0, 1: SIG_DFL, SIG_IGN
}

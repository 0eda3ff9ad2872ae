// Package noptrace makes a process stand in for an engine on a host with
// Yama's ptrace_scope=1 (Ubuntu's default), where a process may not
// ptrace, or read or write the memory of, a process that is not its
// descendant: two engines started side by side cannot reach each other's
// memory that way. The test hosts have no Yama, so a seccomp filter
// refuses the system calls that access needs instead (EPERM, as Yama
// answers), for every thread of the calling process, for good. Opening
// /proc/<pid>/mem, which Yama refuses too, is not covered (a filter cannot
// tell that path): peerkv opens no /proc/<pid> file.
package noptrace

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"golang.org/x/sys/unix"
)

// Refused lists the system calls that reach another process's memory or
// descriptors.
var Refused = []string{"ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "pidfd_getfd"}

// Enter refuses Refused to every thread of this process, and checks that
// it took (see check).
func Enter() error {
	// no_new_privs and the filter are set by two calls on one thread.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	filter := seccomp.Filter{
		NoNewPrivs: true,
		Flag:       seccomp.FilterFlagTSync, // every thread, the Go runtime's included
		Policy: seccomp.Policy{
			DefaultAction: seccomp.ActionAllow,
			Syscalls:      []seccomp.SyscallGroup{{Action: seccomp.ActionErrno, Names: Refused}},
		},
	}
	if err := seccomp.LoadFilter(filter); err != nil {
		return fmt.Errorf("noptrace: load the seccomp filter: %w", err)
	}
	return check()
}

// check proves the filter is in force: process_vm_writev into this very
// process, which the kernel always permits to a process (neither Yama nor
// a security module is asked), must fail with EPERM, where it would fail
// with EFAULT (remote address 0) without the filter; and every thread must
// run under a seccomp filter, as TSYNC promises.
func check() error {
	var b [1]byte
	local := []unix.Iovec{{Base: &b[0], Len: 1}}
	remote := []unix.RemoteIovec{{Base: 0, Len: 1}}
	if _, err := unix.ProcessVMWritev(os.Getpid(), local, remote, 0); !errors.Is(err, unix.EPERM) {
		return fmt.Errorf("noptrace: process_vm_writev into this process was not refused (err %v)", err)
	}
	tasks, err := filepath.Glob("/proc/self/task/*/status")
	if err != nil || len(tasks) == 0 {
		return fmt.Errorf("noptrace: list this process's threads: %v", err)
	}
	for _, status := range tasks {
		text, err := os.ReadFile(status)
		if err != nil {
			continue // the thread ended
		}
		if !strings.Contains(string(text), "\nSeccomp:\t2\n") {
			return fmt.Errorf("noptrace: thread %s runs without the seccomp filter", filepath.Base(filepath.Dir(status)))
		}
	}
	return nil
}

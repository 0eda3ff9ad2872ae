// Package noptrace makes a process stand in for an engine on a host with
// Yama's ptrace_scope=1 (Ubuntu's default), where a process may not
// ptrace, or read or write the memory of, a process that is not its
// descendant: two engines started side by side cannot reach each other's
// memory that way. The test hosts have no Yama, so a seccomp filter
// refuses the system calls that access needs instead (EPERM, as Yama
// answers), for every thread of the calling process, for good.
package noptrace

import (
	"errors"
	"fmt"
	"os"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"golang.org/x/sys/unix"
)

// Refused lists the system calls that reach another process's memory.
var Refused = []string{"ptrace", "process_vm_readv", "process_vm_writev"}

// Enter refuses Refused to this process and checks that it took: writing
// one byte into the parent's memory with process_vm_writev must fail with
// EPERM.
func Enter() error {
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
	return Check(os.Getppid())
}

// Check returns nil when process_vm_writev into pid is refused with EPERM.
// It writes nothing either way: the remote address is 0, which the kernel
// would refuse with EFAULT had it let the call through.
func Check(pid int) error {
	var b [1]byte
	local := []unix.Iovec{{Base: &b[0], Len: 1}}
	remote := []unix.RemoteIovec{{Base: 0, Len: 1}}
	_, err := unix.ProcessVMWritev(pid, local, remote, 0)
	if errors.Is(err, unix.EPERM) {
		return nil
	}
	return fmt.Errorf("noptrace: process_vm_writev into pid %d was not refused (err %v)", pid, err)
}

// Package foreignsig makes a process stand in for a host that installs its
// own fatal-signal handlers after peerkv's Go runtime started, as Python's
// faulthandler does when vLLM's EngineCore (or PYTHONFAULTHANDLER) enables
// it after the library loaded: a SIGBUS then reaches that handler, not Go's,
// and the process dies of it whatever Go's debug.SetPanicOnFault asked for.
package foreignsig

/*
#include <signal.h>
#include <string.h>
#include <unistd.h>

// fatal_bus reports and dies, as faulthandler does once it has dumped the
// tracebacks (it then re-raises the signal).
static void fatal_bus(int sig) {
	static const char msg[] = "foreignsig: fatal bus error (SIGBUS reached the host's handler)\n";
	ssize_t unused = write(2, msg, sizeof msg - 1);
	(void)unused;
	_exit(70); // ExitCode
}

static int install_fatal_sigbus(void) {
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = fatal_bus;
	sigemptyset(&sa.sa_mask);
	return sigaction(SIGBUS, &sa, NULL);
}
*/
import "C"

import "fmt"

// ExitCode is the status a process ends with when its SIGBUS handler ran.
const ExitCode = 70

// InstallFatalSIGBUS replaces the process's SIGBUS handler, Go's, with a
// plain C one that writes a line to stderr and exits with ExitCode.
func InstallFatalSIGBUS() error {
	if rc, err := C.install_fatal_sigbus(); rc != 0 {
		return fmt.Errorf("foreignsig: sigaction(SIGBUS): %v", err)
	}
	return nil
}

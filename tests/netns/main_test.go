// Package netns is peerkv's multi-host suite: real peers, each a process in
// a network namespace of its own (a "host"), joined by veth links to a
// router namespace, with the faults a real network has and loopback lacks:
// a host that dies without its FIN or RST reaching anyone, a black hole
// (packets silently dropped), a slow link (tc tbf), packet loss and
// filters (nft), addresses with no route. See docs/testing.md,
// "Multi-host suite".
//
// The test binary runs three roles, chosen by environment in TestMain:
//   - the launcher (go test runs it): re-executes itself as the router in a
//     new user and network namespace (only a new network namespace when
//     user namespaces are off and it runs as root), and exits with its
//     status. It never runs tests itself.
//   - the router (worldEnv): runs the tests; hosts are its children, each
//     in a new network namespace, routed through it.
//   - a host (peerEnv): one peerkv node driven over stdin (peer_test.go).
package netns

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"testing"
)

const (
	worldEnv = "PEERKV_NETNS_ROUTER"
	peerEnv  = "PEERKV_NETNS_PEER"
)

func TestMain(m *testing.M) {
	switch {
	case os.Getenv(peerEnv) != "":
		os.Exit(runPeer())
	case os.Getenv(worldEnv) != "":
		if err := setUpRouter(); err != nil {
			fmt.Fprintf(os.Stderr, "netns: cannot set up the router namespace: %v\n", err)
			os.Exit(1)
		}
		os.Exit(m.Run())
	default:
		os.Exit(launch())
	}
}

// launch runs this binary again as the router and returns its exit status.
// A machine where no namespace can be made fails the suite, naming why:
// the suite is part of make test and must not pass by doing nothing.
func launch() int {
	for _, tool := range []struct{ name, pkg string }{{"ip", "iproute2"}, {"tc", "iproute2"}, {"nft", "nftables"}} {
		if _, err := exec.LookPath(tool.name); err != nil {
			fmt.Fprintf(os.Stderr, "netns: FAIL: the multi-host suite needs %s (%s): scripts/setup.sh installs it\n", tool.name, tool.pkg)
			return 1
		}
	}
	userns := &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNET,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getgid(), Size: 1}},
		Pdeathsig:   syscall.SIGKILL,
	}
	netOnly := &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNET, Pdeathsig: syscall.SIGKILL}
	var tried []string
	for _, attr := range []*syscall.SysProcAttr{userns, netOnly} {
		cmd := reexec(os.Args[1:]...)
		cmd.Env = append(os.Environ(), worldEnv+"=1")
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
		cmd.SysProcAttr = attr
		err := cmd.Run()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			return exit.ExitCode()
		}
		if err == nil {
			return 0
		}
		tried = append(tried, err.Error()) // the router never started: try the next way
	}
	fmt.Fprintf(os.Stderr, "netns: FAIL: cannot create a network namespace (user+net: %s; net as uid %d: %s): "+
		"the multi-host suite needs root (CAP_SYS_ADMIN) or unprivileged user namespaces "+
		"(sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0)\n", tried[0], os.Getuid(), tried[1])
	return 1
}

// reexec runs this binary again, under its own name in ps.
func reexec(args ...string) *exec.Cmd {
	cmd := exec.Command("/proc/self/exe", args...)
	cmd.Args[0] = os.Args[0]
	return cmd
}

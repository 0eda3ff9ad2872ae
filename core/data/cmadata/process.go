package cmadata

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// process names one process on one host: writes may go to it only when
// host matches ours (same boot, same PID namespace) and the pid still
// belongs to the process that started at start.
type process struct {
	host  string // boot id + PID namespace
	pid   int
	start uint64 // start time in clock ticks since boot (/proc/PID/stat field 22)
}

// String is the locator advertised in connect: "boot-id/pid-ns/pid/start".
func (p process) String() string { return fmt.Sprintf("%s/%d/%d", p.host, p.pid, p.start) }

func parseProcess(s string) (process, error) {
	parts := strings.Split(s, "/")
	if len(parts) != 4 {
		return process{}, fmt.Errorf("process locator %q: want boot-id/pid-ns/pid/start", s)
	}
	pid, err := strconv.Atoi(parts[2])
	if err != nil || pid <= 0 {
		return process{}, fmt.Errorf("process locator %q: bad pid", s)
	}
	start, err := strconv.ParseUint(parts[3], 10, 64)
	if err != nil {
		return process{}, fmt.Errorf("process locator %q: bad start time", s)
	}
	return process{host: parts[0] + "/" + parts[1], pid: pid, start: start}, nil
}

// self describes this process.
func self() (process, error) {
	boot, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	if err != nil {
		return process{}, fmt.Errorf("boot id: %w", err)
	}
	ns, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		return process{}, fmt.Errorf("pid namespace: %w", err)
	}
	pid := os.Getpid()
	start, err := startTime(pid)
	if err != nil {
		return process{}, err
	}
	host := strings.TrimSpace(string(boot)) + "/" + strings.NewReplacer("/", "_", ":", "_").Replace(ns)
	return process{host: host, pid: pid, start: start}, nil
}

// errGone reports that a pid no longer belongs to the advertised process.
var errGone = errors.New("the peer process is gone")

// startTime reads field 22 of /proc/PID/stat. The command name (field 2)
// may hold spaces and parentheses, so fields are counted after its last ')'.
func startTime(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, fmt.Errorf("%w (pid %d)", errGone, pid)
		}
		return 0, err
	}
	s := string(b)
	end := strings.LastIndexByte(s, ')')
	if end < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command field", pid)
	}
	fields := strings.Fields(s[end+1:]) // fields 3, 4, ...
	const startField = 22 - 3
	if len(fields) <= startField {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(fields)+2)
	}
	return strconv.ParseUint(fields[startField], 10, 64)
}

// stillThere checks that p's pid was not reused by another process.
func (p process) stillThere() error {
	start, err := startTime(p.pid)
	if err != nil {
		return err
	}
	if start != p.start {
		return fmt.Errorf("%w: pid %d now belongs to another process", errGone, p.pid)
	}
	return nil
}

package benchproc

import (
	"bytes"
	"os"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// UserHZ is the tick of /proc/<pid>/task/<tid>/stat CPU times.
const UserHZ = 100

// Thread is one thread of this process: its id, its name (comm) and the
// CPU it used so far, in UserHZ ticks.
type Thread struct {
	ID, Name string
	Ticks    int64
}

// CPU is this process's CPU time (getrusage) and that of each of its
// threads still running.
func CPU() (time.Duration, []Thread, error) {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0, nil, err
	}
	total := time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	var threads []Thread
	tids, _ := os.ReadDir("/proc/self/task")
	for _, tid := range tids {
		stat, err := os.ReadFile("/proc/self/task/" + tid.Name() + "/stat")
		if err != nil {
			continue // the thread ended
		}
		open, end := bytes.IndexByte(stat, '('), bytes.LastIndexByte(stat, ')')
		if open < 0 || end < open {
			continue
		}
		// Fields after the ")" closing comm: state is 3, utime 14, stime 15.
		f := strings.Fields(string(stat[end+1:]))
		if len(f) < 13 {
			continue
		}
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		threads = append(threads, Thread{ID: tid.Name(), Name: string(stat[open+1 : end]), Ticks: utime + stime})
	}
	return total, threads, nil
}

package hostile

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"sync/atomic"
	"time"
)

// victimProfileEnv, set to a directory, makes each victim write there its
// CPU, mutex and block profiles (at exit) and, for every host call that
// runs past slowCallDump, every goroutine's stack while it still runs: the
// way to find what holds a host call up. Off unless set.
const victimProfileEnv = "PEERKV_VICTIM_PROFILE"

const slowCallDump = 10 * time.Millisecond

// callWatch is the host call in progress, for the profiler's watchdog.
type callWatch struct {
	start atomic.Int64 // unix ns; 0 between calls
	name  atomic.Pointer[string]
	seq   atomic.Int64
}

func (w *callWatch) begin(name string) {
	w.name.Store(&name)
	w.seq.Add(1)
	w.start.Store(time.Now().UnixNano())
}
func (w *callWatch) end() { w.start.Store(0) }

// startVictimProfile starts the profiles when victimProfileEnv is set and
// returns what writes them.
func startVictimProfile(w *callWatch) (stop func()) {
	dir := os.Getenv(victimProfileEnv)
	if dir == "" {
		return func() {}
	}
	dir = filepath.Join(dir, fmt.Sprint(os.Getpid()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return func() {}
	}
	victimMemory = &memoryWatch{dir: dir}
	victimMemory.last.Store(readRSS())
	runtime.SetMutexProfileFraction(1)
	runtime.SetBlockProfileRate(int(time.Millisecond))
	cpu, _ := os.Create(filepath.Join(dir, "cpu.pprof"))
	_ = pprof.StartCPUProfile(cpu)
	done := make(chan struct{})
	go func() {
		dumped, n := int64(-1), 0
		for {
			select {
			case <-done:
				return
			case <-time.After(time.Millisecond):
			}
			start, seq := w.start.Load(), w.seq.Load()
			if start == 0 || seq == dumped || time.Since(time.Unix(0, start)) < slowCallDump || n >= 40 {
				continue
			}
			dumped, n = seq, n+1
			f, err := os.Create(filepath.Join(dir, fmt.Sprintf("slow-%02d-%s.txt", n, *w.name.Load())))
			if err != nil {
				continue
			}
			fmt.Fprintf(f, "host call %s running for %v\n", *w.name.Load(), time.Since(time.Unix(0, start)))
			_ = pprof.Lookup("goroutine").WriteTo(f, 2)
			_ = f.Close()
		}
	}()
	return func() {
		close(done)
		pprof.StopCPUProfile()
		_ = cpu.Close()
		for _, p := range []string{"mutex", "block"} {
			if f, err := os.Create(filepath.Join(dir, p+".pprof")); err == nil {
				_ = pprof.Lookup(p).WriteTo(f, 0)
				_ = f.Close()
			}
		}
	}
}

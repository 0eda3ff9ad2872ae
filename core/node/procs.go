package node

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
)

// Sizing the Go runtime inside the host's process (go_max_procs).
//
// GOMAXPROCS bounds the threads running Go code at once; the runtime is
// one per process, so the size is process-wide. Inside vLLM's EngineCore
// those threads share the CPUs with the scheduler and the model's own
// threads, and peerkv's Go work is mostly waiting (control sockets, TCP
// streams, deadline ticks) plus the same-host copy, which uses at most
// maxShmWorkers threads. So the default is the runtime's own default (the
// CPUs this process may use: the affinity mask, capped by a cgroup CPU
// quota) capped at DefaultMaxProcsCap. go_max_procs sets it explicitly; a
// GOMAXPROCS variable in the environment, read by the runtime when the
// library loads, wins over both and is left alone. When several nodes of
// one process ask for different sizes, the largest wins.
const DefaultMaxProcsCap = 4

// initialProcs is the runtime's own default, taken when the library loads,
// before any node sized it.
var initialProcs = runtime.GOMAXPROCS(0)

var procs struct {
	mu  sync.Mutex
	set int // the size a node of this process set (0: none yet)
}

// DefaultGoMaxProcs is what a node without go_max_procs sets.
func DefaultGoMaxProcs() int { return min(initialProcs, DefaultMaxProcsCap) }

// procsChoice is one node's sizing decision, logged when the node starts.
type procsChoice struct {
	n     int    // GOMAXPROCS after the decision
	apply bool   // whether runtime.GOMAXPROCS(n) must be called
	why   string // the log line
}

func (p procsChoice) String() string { return p.why }

// decideProcs is the sizing rule, apart from the process state it reads.
func decideProcs(asked int, env string, envSet bool, initial, already int) procsChoice {
	if envSet && strings.TrimSpace(env) != "" {
		why := fmt.Sprintf("Go runtime: GOMAXPROCS=%s from the environment", strings.TrimSpace(env))
		if asked > 0 {
			why += fmt.Sprintf(" (go_max_procs %d ignored: the environment variable wins)", asked)
		}
		return procsChoice{why: why}
	}
	want := asked
	why := fmt.Sprintf("Go runtime: GOMAXPROCS %d (go_max_procs)", want)
	if asked <= 0 {
		want = min(initial, DefaultMaxProcsCap)
		why = fmt.Sprintf("Go runtime: GOMAXPROCS %d (default: %d CPUs available to this process, capped at %d; "+
			"go_max_procs sets it)", want, initial, DefaultMaxProcsCap)
	}
	if already >= want {
		if already > want {
			why = fmt.Sprintf("Go runtime: GOMAXPROCS stays %d, set by another node of this process (this one asked for %d)",
				already, want)
		}
		return procsChoice{n: already, why: why}
	}
	return procsChoice{n: want, apply: true, why: why}
}

// sizeGoRuntime applies the rule for a node that asked for asked (0 =
// default) and returns the line to log.
func sizeGoRuntime(asked int) procsChoice {
	env, envSet := os.LookupEnv("GOMAXPROCS")
	procs.mu.Lock()
	defer procs.mu.Unlock()
	c := decideProcs(asked, env, envSet, initialProcs, procs.set)
	if c.apply {
		runtime.GOMAXPROCS(c.n)
		procs.set = c.n
	}
	return c
}

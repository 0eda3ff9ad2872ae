package node

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestGoRuntimeSizing(t *testing.T) {
	for name, c := range map[string]struct {
		asked, initial, already int
		env                     string
		envSet                  bool
		n                       int
		apply                   bool
		says                    string
	}{
		"default on a big host is capped": {initial: 64, n: 4, apply: true, says: "default: 64 CPUs available to this process, capped at 4"},
		"default on a small quota":        {initial: 2, n: 2, apply: true, says: "GOMAXPROCS 2 (default: 2 CPUs"},
		"explicit option":                 {asked: 12, initial: 64, n: 12, apply: true, says: "GOMAXPROCS 12 (go_max_procs)"},
		"explicit option above the CPUs":  {asked: 8, initial: 2, n: 8, apply: true, says: "GOMAXPROCS 8 (go_max_procs)"},
		"environment wins":                {asked: 12, initial: 64, env: "3", envSet: true, says: "GOMAXPROCS=3 from the environment (go_max_procs 12 ignored"},
		"environment, no option":          {initial: 64, env: "7", envSet: true, says: "GOMAXPROCS=7 from the environment"},
		"empty environment variable":      {initial: 64, env: "", envSet: true, n: 4, apply: true, says: "default"},
		"another node set more":           {initial: 64, already: 8, n: 8, says: "stays 8, set by another node of this process (this one asked for 4)"},
		"another node set less":           {asked: 6, initial: 64, already: 4, n: 6, apply: true, says: "GOMAXPROCS 6"},
	} {
		t.Run(name, func(t *testing.T) {
			got := decideProcs(c.asked, c.env, c.envSet, c.initial, c.already)
			assert.Equal(t, c.n, got.n)
			assert.Equal(t, c.apply, got.apply)
			assert.Contains(t, got.why, c.says)
		})
	}
}

// The process-wide part: a node sizes the runtime, and a later node asking
// for less does not shrink it.
func TestSizeGoRuntimeSetsTheRuntime(t *testing.T) {
	t.Setenv("GOMAXPROCS", "") // set but empty: as if unset
	old := runtime.GOMAXPROCS(0)
	procs.mu.Lock()
	saved := procs.set
	procs.set = 0
	procs.mu.Unlock()
	t.Cleanup(func() {
		runtime.GOMAXPROCS(old)
		procs.mu.Lock()
		procs.set = saved
		procs.mu.Unlock()
	})
	sizeGoRuntime(3)
	assert.Equal(t, 3, runtime.GOMAXPROCS(0))
	c := sizeGoRuntime(1)
	assert.Equal(t, 3, runtime.GOMAXPROCS(0), "the largest size asked for wins")
	assert.Contains(t, c.String(), "stays 3")
	assert.Equal(t, min(initialProcs, DefaultMaxProcsCap), DefaultGoMaxProcs())
}

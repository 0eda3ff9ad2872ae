package hostile

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"runtime/metrics"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"
)

// What a victim's RSS is made of, for victimProfileEnv: each time its RSS
// passes its last snapshot by memoryStep, the victim reads /proc/self/smaps
// and the Go runtime's own figures, and writes the largest such breakdown
// (memory.txt) and a heap profile (heap.pprof) as it goes; the breakdown
// at the test's "reset" (the idle figure) is memory-idle.txt. It tells the Go
// heap from what C code (libzmq) took from malloc and from the race
// detector's shadow.
const memoryStep = 16 << 20

// memoryBreakdown is resident bytes by where they live.
type memoryBreakdown struct {
	rss     int64
	classes map[string]int64 // resident bytes by mapping class
	goHeap  int64            // live objects and unswept garbage
	goAlloc int64            // heap spans in use
	goStack int64
	goTotal int64 // mapped by the Go runtime, less what it returned
}

func (m memoryBreakdown) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "rss %s; go: heap objects %s, spans in use %s, stacks %s, mapped-not-released %s\n",
		inMiB(m.rss), inMiB(m.goHeap), inMiB(m.goAlloc), inMiB(m.goStack), inMiB(m.goTotal))
	var names []string
	for k := range m.classes {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool { return m.classes[names[i]] > m.classes[names[j]] })
	for _, k := range names {
		fmt.Fprintf(&b, "  %-28s %s\n", k, inMiB(m.classes[k]))
	}
	return b.String()
}

// victimMemory is set in a victim when victimProfileEnv is.
var victimMemory *memoryWatch

// memoryWatch writes the breakdown each time the RSS passed the last one
// it wrote by memoryStep, since the last reset, and the one at the reset
// (the idle figure) beside it.
type memoryWatch struct {
	mu   sync.Mutex // one breakdown at a time
	dir  string
	last atomic.Int64 // the RSS of the last breakdown written
}

// reset starts again from now: memory-idle.txt is now's breakdown.
func (w *memoryWatch) reset() {
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	idle := readMemory()
	w.last.Store(idle.rss)
	_ = os.WriteFile(filepath.Join(w.dir, "memory-idle.txt"), []byte(idle.String()), 0o644)
}

// observe is called with each RSS sample.
func (w *memoryWatch) observe(rss int64) {
	if w == nil || rss < w.last.Load()+memoryStep {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if rss < w.last.Load()+memoryStep {
		return
	}
	top := readMemory()
	w.last.Store(rss)
	if f, err := os.Create(filepath.Join(w.dir, "heap.pprof")); err == nil {
		_ = pprof.Lookup("heap").WriteTo(f, 0)
		_ = f.Close()
	}
	_ = os.WriteFile(filepath.Join(w.dir, "memory.txt"), []byte(top.String()), 0o644)
}

func readMemory() memoryBreakdown {
	m := memoryBreakdown{rss: readRSS(), classes: map[string]int64{}}
	samples := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"}, {Name: "/memory/classes/heap/stacks:bytes"},
		{Name: "/memory/classes/total:bytes"}, {Name: "/memory/classes/heap/released:bytes"}}
	metrics.Read(samples)
	m.goHeap = int64(samples[0].Value.Uint64())
	m.goAlloc = m.goHeap + int64(samples[1].Value.Uint64())
	m.goStack = int64(samples[2].Value.Uint64())
	m.goTotal = int64(samples[3].Value.Uint64() - samples[4].Value.Uint64())
	f, err := os.Open("/proc/self/smaps")
	if err != nil {
		return m
	}
	defer f.Close()
	class, block := "", goHeapBlock()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		if strings.Contains(fields[0], "-") && len(fields) >= 5 { // a mapping's header
			class = mappingClass(fields, block)
			continue
		}
		if fields[0] == "Rss:" && len(fields) >= 2 {
			kb, _ := strconv.ParseInt(fields[1], 10, 64)
			m.classes[class] += kb << 10
		}
	}
	return m
}

// goHeapBlock is the 64 GiB of address space around Go's heap arenas,
// read off an object allocated on the heap: the heap starts at a base
// the runtime picks (0x00c000000000 under the race detector, at random
// without) and grows up from there.
func goHeapBlock() uint64 {
	heapProbe = make([]byte, 64<<10)
	return uint64(uintptr(unsafe.Pointer(&heapProbe[0]))) >> 36
}

var heapProbe []byte // escapes, so the probe is on the heap

// mappingClass names a mapping of smaps: the Go heap's arenas,
// the race detector's shadow, malloc's main heap, files, and other
// anonymous memory (malloc's thread arenas and large chunks, C stacks).
func mappingClass(header []string, goBlock uint64) string {
	if len(header) >= 6 {
		switch name := header[5]; {
		case name == "[heap]":
			return "malloc main heap [heap]"
		case strings.HasPrefix(name, "["):
			return name
		default:
			return "files"
		}
	}
	lo, _ := strconv.ParseUint(strings.Split(header[0], "-")[0], 16, 64)
	switch {
	case lo>>36 == goBlock:
		return "go heap arenas"
	case raceEnabled && lo >= 0x200000000000 && lo < 0x400000000000:
		return "race shadow/meta"
	default:
		return "other anonymous (malloc arenas, C)"
	}
}

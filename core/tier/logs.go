package tier

import (
	"fmt"
	"strings"
	"sync"
)

// logRing buffers log lines for the host to collect (peerkv_take_logs),
// bounded in bytes; overflow drops the oldest lines and says so.
type logRing struct {
	mu      sync.Mutex
	lines   []string
	size    int
	max     int
	dropped int
}

func newLogRing(maxBytes int) *logRing { return &logRing{max: maxBytes} }

func (r *logRing) add(line string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.lines = append(r.lines, line)
	r.size += len(line)
	for r.size > r.max && len(r.lines) > 1 {
		r.size -= len(r.lines[0])
		r.lines = r.lines[1:]
		r.dropped++
	}
}

// take returns whole lines, at most max bytes in all.
func (r *logRing) take(max int) []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	if r.dropped > 0 {
		note := fmt.Sprintf("WARNING peerkv log buffer overflowed; %d lines were dropped\n", r.dropped)
		if len(note) > max {
			return nil
		}
		b.WriteString(note)
		r.dropped = 0
	}
	n := 0
	for _, l := range r.lines {
		if b.Len()+len(l) > max {
			break
		}
		b.WriteString(l)
		r.size -= len(l)
		n++
	}
	r.lines = r.lines[n:]
	return []byte(b.String())
}

// Logf writes one line to the host's log: level is "DEBUG", "INFO",
// "WARNING" or "ERROR".
type Logf func(level, format string, args ...any)

func (t *Tier) logf(level, format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	t.logs.add(level + " " + strings.ReplaceAll(msg, "\n", "\n  ") + "\n")
	t.news.bump(NewsLogs)
}

// TakeLogs returns pending log lines ("LEVEL message\n"), at most max bytes.
func (t *Tier) TakeLogs(max int) []byte { return t.logs.take(max) }

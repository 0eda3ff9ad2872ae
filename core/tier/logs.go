package tier

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/peerkv/peerkv/core/session"
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

// logf is the one way into the host's log: the tier's lines, its
// sessions' (Env.Logf) and its data paths' (Deps.NewData's logf). Each
// cause is rate-limited (logLimited), since a remote party can trigger
// most of them at will; INFO lines are not: they mark what our own host
// did (a request's sources, startup, shutdown), and operators (and tests)
// look for them. An INFO line a remote party causes (a session it opened
// registered, or closed) goes through peerInfo instead.
func (h *hostSide) logf(level, format string, args ...any) {
	if level == "INFO" {
		h.log.ring.add(logLine(level, fmt.Sprintf(format, args...)))
		h.tell(NewsLogs, false)
		return
	}
	h.logLimited(level, format, args...)
}

// logf is the host side's, for the coordinator's own lines.
func (t *Tier) logf(level, format string, args ...any) { t.host.logf(level, format, args...) }

// peerInfo logs an INFO line about a session: rate-limited, as every
// other level, when the peer dialed us (in default mode anyone can, again
// and again); not when we dialed it (our host asked for it).
func (h *hostSide) peerInfo(s *session.Session, format string, args ...any) {
	if s != nil && s.Dialed() {
		h.logf("INFO", format, args...)
		return
	}
	h.logLimited("INFO", format, args...)
}

// logLimited logs one line through the rate limit of its cause.
func (h *hostSide) logLimited(level, format string, args ...any) {
	emit, summary := h.log.limiter.admit(level, format, args, h.now())
	if summary != "" {
		h.log.ring.add(summary)
	}
	if emit {
		h.log.ring.add(logLine(level, fmt.Sprintf(format, args...)))
	}
	if emit || summary != "" {
		h.tell(NewsLogs, false)
	}
}

// flushLogs logs what the rate limit suppressed in windows that are over,
// so a flood that stopped is still reported; the progress loop calls it.
func (h *hostSide) flushLogs(now time.Time) {
	if lines := h.log.limiter.due(now); len(lines) > 0 {
		for _, l := range lines {
			h.log.ring.add(l)
		}
		h.tell(NewsLogs, false)
	}
}

func logLine(level, msg string) string {
	return level + " " + strings.ReplaceAll(msg, "\n", "\n  ") + "\n"
}

// Each cause (a call site: its level and format string) logs at most
// logBurst lines per logWindow. Lines beyond are counted, not formatted;
// when the window is over one line reports how many there were, with the
// last of them. A flood of one cause leaves every other cause's budget
// whole.
const (
	logBurst  = 10
	logWindow = 10 * time.Second
	// maxLogCauses bounds the causes tracked (format strings are constants,
	// so real code has far fewer); beyond it, new causes share one budget.
	maxLogCauses = 1024
)

// hostLog is what the host reads of our log: a ring of lines, and a
// limiter per cause. Each has its own lock, as data paths log from their
// goroutines.
type hostLog struct {
	ring    *logRing
	limiter logLimiter
}

type logLimiter struct {
	mu     sync.Mutex
	causes map[logKey]*logCause
	owed   int // causes with suppressed lines not yet reported
}

type logKey struct{ level, format string }

type logCause struct {
	start      time.Time // of the current window
	logged     int
	suppressed int
	last       []any // the args of the last line suppressed
	lastFormat string
}

var sharedCause = logKey{format: "(other causes)"}

// admit says whether a line may be logged now, and returns the report of
// the cause's previous window when that window is over and suppressed lines.
func (l *logLimiter) admit(level, format string, args []any, now time.Time) (bool, string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.causes == nil {
		l.causes = map[logKey]*logCause{}
	}
	k := logKey{level, format}
	c := l.causes[k]
	if c == nil {
		if len(l.causes) >= maxLogCauses {
			k = sharedCause
			c = l.causes[k]
		}
		if c == nil {
			c = &logCause{start: now}
			l.causes[k] = c
		}
	}
	summary := ""
	if now.Sub(c.start) >= logWindow {
		summary = l.close(k, c, now)
	}
	if c.logged < logBurst {
		c.logged++
		return true, summary
	}
	if c.suppressed == 0 {
		l.owed++
	}
	c.suppressed++
	c.last, c.lastFormat = args, format
	return false, summary
}

// close ends c's window at now, returning its report ("" if it suppressed
// nothing).
func (l *logLimiter) close(k logKey, c *logCause, now time.Time) string {
	summary := ""
	if c.suppressed > 0 {
		l.owed--
		level := k.level
		if k == sharedCause {
			level = "WARNING"
		}
		summary = logLine(level, fmt.Sprintf("%s (%d lines like this suppressed in the last %v; this is the last)",
			fmt.Sprintf(c.lastFormat, c.last...), c.suppressed, now.Sub(c.start).Round(time.Second)))
	}
	*c = logCause{start: now}
	return summary
}

// due closes every window that is over and suppressed lines, returning
// their reports.
func (l *logLimiter) due(now time.Time) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.owed == 0 {
		return nil
	}
	var out []string
	for k, c := range l.causes {
		if c.suppressed > 0 && now.Sub(c.start) >= logWindow {
			out = append(out, l.close(k, c, now))
		}
	}
	return out
}

// TakeLogs returns pending log lines ("LEVEL message\n"), at most max bytes.
func (t *Tier) TakeLogs(max int) []byte { return t.host.log.ring.take(max) }

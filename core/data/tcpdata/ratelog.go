package tcpdata

import (
	"fmt"
	"sync"
	"time"
)

// logInterval is the least time between two log lines of one cause.
const logInterval = 10 * time.Second

// rateLog writes at most one line per cause per interval: strangers can
// make a cause happen thousands of times a second. The next line of a cause
// says how many were left out since the last one; the counters in
// InboundStats count them all.
type rateLog struct {
	out      func(format string, args ...any)
	interval time.Duration

	mu     sync.Mutex
	causes map[string]*causeLog
}

type causeLog struct {
	last       time.Time
	suppressed int
}

func newRateLog(logf func(string, ...any), interval time.Duration) rateLog {
	return rateLog{out: logf, interval: interval, causes: map[string]*causeLog{}}
}

// logf logs one occurrence of cause, unless a line of that cause was
// written less than an interval ago. Causes are a fixed set of constants.
func (l *rateLog) logf(cause, format string, args ...any) {
	now := time.Now()
	l.mu.Lock()
	c := l.causes[cause]
	if c == nil {
		c = &causeLog{}
		l.causes[cause] = c
	}
	if !c.last.IsZero() && now.Sub(c.last) < l.interval {
		c.suppressed++
		l.mu.Unlock()
		return
	}
	suppressed, since := c.suppressed, now.Sub(c.last)
	c.last, c.suppressed = now, 0
	l.mu.Unlock()
	line := fmt.Sprintf(format, args...)
	if suppressed > 0 {
		line += fmt.Sprintf(" (and %d more in the last %v, not logged)", suppressed, since.Round(time.Second))
	}
	l.out("tcpdata: %s: %s", cause, line)
}

package tier

import "time"

// hostSide owns what the host learns without a call of ours reaching it:
// its log (a ring of lines, each cause rate-limited; logs.go), the news
// counts it reads in memory (news.go) and the notification fd it polls
// (notify.go). It is the only writer of each. Every part has its own lock
// or atomics, so any goroutine may use it without the tier's lock: data
// paths log from their own, and the host reads while the loop writes.
type hostSide struct {
	log    hostLog
	notify notifier
	news   news
	now    func() time.Time // the log limiter's clock
}

func newHostSide(now func() time.Time) *hostSide {
	return &hostSide{log: hostLog{ring: newLogRing(1 << 20)}, news: newNews(), now: now}
}

// tell records that something of kind k waits for the host to collect,
// and, with wake, makes the notification fd readable. Log lines never wake
// the host (it collects them when it comes anyway); answers wake it only
// when they changed outside a host call.
func (h *hostSide) tell(k NewsKind, wake bool) {
	h.news.bump(k)
	if wake {
		h.notify.signal()
	}
}

// stopped tells the host, once, that the node stopped: every kind may have
// changed (the jobs failed), so it collects each and stops waiting.
func (h *hostSide) stopped() {
	h.news.bumpAll()
	h.notify.signal()
}

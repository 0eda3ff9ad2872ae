package tier

import (
	"sync/atomic"
	"syscall"
	"unsafe"
)

// NewsKind names one thing the host collects with a call of its own.
type NewsKind int

const (
	NewsResults NewsKind = iota // job results (GetFinished)
	NewsAnswers                 // changed lookup answers (TakeAnswers)
	NewsInbound                 // inbound work (NextInbound)
	NewsLogs                    // log lines (TakeLogs)
	NewsKinds
)

// news counts, per kind, how often something was queued for the host, in
// words the host reads without calling in: a count it has seen already
// means that call has nothing to do, so an idle host makes no call at all.
// Counts only grow; a host compares them, never computes with them.
//
// The words live in a page of their own, outside Go's heap, so the host
// may keep a pointer to them; it is never unmapped, so a write from a
// goroutine still stopping can never land in memory reused for something
// else (one page per peer, for the life of the process).
type news struct {
	w      *[NewsKinds]atomic.Uint64
	mapped bool
}

func newNews() news {
	page, err := syscall.Mmap(-1, 0, syscall.Getpagesize(), syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		// Out of address space: keep counting in Go's heap; NewsAddr is nil.
		return news{w: new([NewsKinds]atomic.Uint64)}
	}
	return news{w: (*[NewsKinds]atomic.Uint64)(unsafe.Pointer(&page[0])), mapped: true}
}

func (n news) bump(k NewsKind) { n.w[k].Add(1) }

func (n news) bumpAll() {
	for k := range n.w {
		n.w[k].Add(1)
	}
}

// News is the current count of kind k (what the host reads in memory).
func (t *Tier) News(k NewsKind) uint64 { return t.host.news.w[k].Load() }

// NewsAddr is where the host reads the counts: NewsKinds words of 8 bytes,
// in NewsKind order, valid for the life of the process; nil if the page
// could not be mapped (the host must then call in).
func (t *Tier) NewsAddr() unsafe.Pointer {
	if !t.host.news.mapped {
		return nil
	}
	return unsafe.Pointer(t.host.news.w)
}

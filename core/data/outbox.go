package data

import "sync"

// Outbox delivers a transport's completions on a buffered channel with the
// shutdown rules every transport needs: a Send waits for room only until
// StartClosing, after which it delivers what fits and drops the rest (no
// reader is left to wait for); Finish closes the channel once, after which
// Send drops silently.
type Outbox struct {
	ch      chan Completion
	closing chan struct{}
	once    sync.Once

	mu       sync.RWMutex // held for reading by senders, for writing by Finish
	finished bool
}

// NewOutbox returns an outbox buffering up to size unread completions.
func NewOutbox(size int) *Outbox {
	return &Outbox{ch: make(chan Completion, size), closing: make(chan struct{})}
}

// C is the channel a transport returns from Completions.
func (o *Outbox) C() <-chan Completion { return o.ch }

// Send delivers c and reports whether it was delivered (false only once
// closing has begun and the buffer is full, or after Finish).
func (o *Outbox) Send(c Completion) bool {
	o.mu.RLock()
	defer o.mu.RUnlock()
	if o.finished {
		return false
	}
	select {
	case o.ch <- c:
		return true
	case <-o.closing:
	}
	select {
	case o.ch <- c:
		return true
	default:
		return false
	}
}

// StartClosing stops Send from waiting for a reader. It is idempotent.
func (o *Outbox) StartClosing() { o.once.Do(func() { close(o.closing) }) }

// Finish closes the channel; call it after the transport's goroutines have
// exited. It is idempotent and implies StartClosing.
func (o *Outbox) Finish() {
	o.StartClosing()
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.finished {
		o.finished = true
		close(o.ch)
	}
}

package tier

import "sync"

// lifecycle is the tier's own state: open, then closed by Shutdown or
// poisoned by a panic, never open again. It also holds what stops the
// tier's goroutines. Guarded by t.mu, except the channels and once.
type lifecycle struct {
	closed   bool
	poisoned error // set once a goroutine of ours panicked

	stop         chan struct{} // closed once: every goroutine of the tier ends
	loopDone     chan struct{} // closed by the progress loop as it returns
	shutdownOnce sync.Once
	shutdownErr  error
}

// usable is nil while host calls may change state, else why not.
func (l *lifecycle) usable() error {
	if l.poisoned != nil {
		return l.poisoned
	}
	if l.closed {
		return ErrClosed
	}
	return nil
}

// close ends the open state (Shutdown, poison); it reports whether the
// tier was open until now.
func (l *lifecycle) close() bool {
	was := !l.closed
	l.closed = true
	return was
}

// poison records the first internal failure and closes; it reports whether
// cause is that first one.
func (l *lifecycle) poison(cause error) bool {
	first := l.poisoned == nil
	if first {
		l.poisoned = cause
	}
	l.close()
	return first
}

package tier

// PanicNext makes the named goroutine ("loop" or "registration") panic on
// its next step.
func PanicNext(where string) { panicAt.Store(&where) }

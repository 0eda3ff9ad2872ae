package tier

// PanicNext makes the named goroutine ("loop" or "registration") panic on
// its next step.
func PanicNext(where string) { panicAt.Store(&where) }

// InlineAsk is how many keys a host call registers itself (more are left to
// the loop).
const InlineAsk = inlineAsk

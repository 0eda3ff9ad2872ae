package tier

import "sync/atomic"

// panicAt names the goroutine that panics on its next step; only tests set
// it (export_test.go), to prove a panic poisons the peer instead of
// leaving jobs unreported.
var panicAt atomic.Pointer[string]

func testPanic(where string) {
	if p := panicAt.Load(); p != nil && *p == where && panicAt.CompareAndSwap(p, nil) {
		panic("injected panic in " + where)
	}
}

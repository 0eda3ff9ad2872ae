//go:build peerkv_panictest

package main

import "os"

// PanicEnv names the export that panics in a peerkv_panictest build, e.g.
// PEERKV_PANIC_IN=peerkv_lookup. It exists only to prove that a panic in an
// export is recovered, reported and poisons the library.
const PanicEnv = "PEERKV_PANIC_IN"

var panicIn = os.Getenv(PanicEnv)

func panicPoint(fn string) {
	if panicIn != "" && fn == panicIn {
		panic("injected panic (" + PanicEnv + "=" + fn + ")")
	}
}

//go:build !peerkv_panictest

package main

// panicPoint is a no-op in release builds; see panicpoint_on.go.
func panicPoint(string) {}

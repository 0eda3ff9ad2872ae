// Command capi is built with -buildmode=c-shared into libpeerkv.so. It is the
// only place that speaks C: the public peerkv_* symbols are thin C wrappers
// (wrappers.c) that refuse forked children before entering Go, then call the
// pkvgo_* exports (exports.go) which guard, decode, call the core and map
// errors. include/peerkv.h is the contract; cgo's generated header is a build
// artifact and is deleted by the Makefile.
package main

/*
#cgo CFLAGS: -I${SRCDIR}/../include -Wall
*/
import "C"

import "runtime"

// version is stamped at build time: -ldflags "-X main.version=...".
var version = "0.0.0-dev"

// versionString is what peerkv_version reports.
func versionString() string { return "peerkv " + version + " (" + runtime.Version() + ")" }

func main() {}

package main

/*
#include <stddef.h>
*/
import "C"

import "unsafe"

// cBytes views n bytes of C memory as a Go slice (no copy). nil when p is NULL
// or n is 0.
func cBytes(p unsafe.Pointer, n int) []byte {
	if p == nil || n <= 0 {
		return nil
	}
	return unsafe.Slice((*byte)(p), n)
}

// writeCString copies s into the caller's buffer of capacity bufLen, always
// NUL-terminated, truncating to fit. It reports whether s fit whole. A NULL
// or empty buffer receives nothing.
func writeCString(buf *C.char, bufLen C.size_t, s string) (fits bool) {
	if buf == nil || bufLen == 0 {
		return len(s) == 0
	}
	dst := cBytes(unsafe.Pointer(buf), int(min(bufLen, C.size_t(maxCBuffer))))
	n := copy(dst[:len(dst)-1], s)
	dst[n] = 0
	return n == len(s)
}

// maxCBuffer caps how much of a caller's buffer is ever viewed at once.
const maxCBuffer = 1 << 30

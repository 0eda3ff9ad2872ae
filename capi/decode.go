package main

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"math/bits"
	"unsafe"
)

// maxKeysPerCall bounds n in one call: far above any scheduler step, far
// below sizes whose products could overflow.
const maxKeysPerCall = 1 << 24

// reqID decodes a required, non-empty request id.
func (c *call) reqID(s *C.char) (string, C.int32_t) {
	if s == nil {
		return "", c.failf(statusInvalidArgument, "req_id is NULL")
	}
	id := C.GoString(s)
	if id == "" {
		return "", c.failf(statusInvalidArgument, "req_id is empty")
	}
	return id, statusOK
}

// keys splits the caller's concatenated key buffer into n views of keyLen
// bytes each, without copying (the tier copies what it keeps and checks
// key_len against the option).
func (c *call) keys(ptr *C.uint8_t, keyLen, n C.size_t) ([][]byte, C.int32_t) {
	buf, rc := c.packedKeys(ptr, keyLen, n)
	if rc != statusOK || n == 0 {
		return [][]byte{}, rc
	}
	kl := int(keyLen)
	out := make([][]byte, int(n))
	for i := range out {
		out[i] = buf[i*kl : (i+1)*kl : (i+1)*kl]
	}
	return out, statusOK
}

// packedKeys is the caller's n keys of keyLen bytes, back to back, as one
// view of its memory (valid for the call only).
func (c *call) packedKeys(ptr *C.uint8_t, keyLen, n C.size_t) ([]byte, C.int32_t) {
	if n == 0 {
		return nil, statusOK
	}
	if n > maxKeysPerCall {
		return nil, c.failf(statusInvalidArgument, "n=%d keys exceeds the limit of %d per call", uint64(n), maxKeysPerCall)
	}
	if ptr == nil {
		return nil, c.failf(statusInvalidArgument, "keys is NULL with n=%d", uint64(n))
	}
	if keyLen == 0 {
		return nil, c.failf(statusInvalidArgument, "key_len is 0")
	}
	hi, total := bits.Mul64(uint64(keyLen), uint64(n))
	if hi != 0 || total > maxCBuffer {
		return nil, c.failf(statusInvalidArgument, "%d keys of %d bytes is too large", uint64(n), uint64(keyLen))
	}
	return cBytes(unsafe.Pointer(ptr), int(total)), statusOK
}

// slots copies n row indexes from the caller (small; the tier may keep them).
func (c *call) slots(name string, ptr *C.int64_t, n C.size_t) ([]int64, C.int32_t) {
	if n == 0 {
		return []int64{}, statusOK
	}
	if n > maxKeysPerCall {
		return nil, c.failf(statusInvalidArgument, "%s: n=%d exceeds the limit of %d per call", name, uint64(n), maxKeysPerCall)
	}
	if ptr == nil {
		return nil, c.failf(statusInvalidArgument, "%s is NULL with n=%d", name, uint64(n))
	}
	return append([]int64(nil), unsafe.Slice((*int64)(unsafe.Pointer(ptr)), int(n))...), statusOK
}

// writeJSON implements the size protocol of peerkv_info and peerkv_stats:
// *needed = len(doc)+1; the document is written only when it fits whole.
func (c *call) writeJSON(doc []byte, buf *C.char, bufLen C.size_t, needed *C.size_t) C.int32_t {
	if needed == nil {
		return c.failf(statusInvalidArgument, "needed is NULL")
	}
	*needed = C.size_t(len(doc) + 1)
	if bufLen < *needed || buf == nil {
		writeCString(buf, bufLen, "")
		return c.failf(statusBufferTooSmall, "buffer of %d bytes is too small: %d needed", uint64(bufLen), len(doc)+1)
	}
	writeCString(buf, bufLen, string(doc))
	return statusOK
}

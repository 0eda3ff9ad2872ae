package main

/*
#include "peerkv.h"
*/
import "C"

import (
	"unsafe"

	"github.com/peerkv/peerkv/core/tier"
)

// nextInboundNone is peerkv_next_inbound's "no work" return value.
const nextInboundNone = C.int32_t(1)

// maxSkippedInbound bounds how many unrepresentable items one call answers
// itself before returning.
const maxSkippedInbound = 1024

// inboundKeyLen is the uniform key length of item, or -1 when its keys
// differ in length (only possible when the key_len option is 0).
func inboundKeyLen(item tier.Inbound) int {
	if len(item.Keys) == 0 {
		return 0
	}
	l := len(item.Keys[0])
	for _, k := range item.Keys[1:] {
		if len(k) != l {
			return -1
		}
	}
	return l
}

//export pkvgo_next_inbound
func pkvgo_next_inbound(h C.peerkv_handle, lookupID *C.int64_t, kind, first *C.int32_t,
	reqIDBuf *C.char, reqIDCap C.size_t, reqIDNeeded *C.size_t,
	keysBuf *C.uint8_t, keysCap C.size_t, nKeys *C.size_t, errBuf *C.char, errLen C.size_t) C.int32_t {
	return enterNode("peerkv_next_inbound", h, errBuf, errLen, func(c call, t *tier.Tier) C.int32_t {
		if lookupID == nil || kind == nil || first == nil || reqIDNeeded == nil || nKeys == nil {
			return c.failf(statusInvalidArgument, "lookup_id, kind, first, req_id_needed and n_keys must not be NULL")
		}
		if reqIDBuf == nil {
			reqIDCap = 0
		}
		if keysBuf == nil {
			keysCap = 0
		}
		fits := func(item tier.Inbound) bool {
			kl := inboundKeyLen(item)
			if kl < 0 {
				return true // taken and answered below: the ABI cannot carry it
			}
			return uint64(len(item.ReqID))+1 <= uint64(reqIDCap) && uint64(kl)*uint64(len(item.Keys)) <= uint64(keysCap)
		}
		for range maxSkippedInbound {
			item, ok, taken := t.NextInbound(fits)
			if !ok {
				return nextInboundNone
			}
			*reqIDNeeded = C.size_t(len(item.ReqID) + 1)
			*nKeys = C.size_t(len(item.Keys))
			if !taken {
				return c.failf(statusBufferTooSmall, "inbound lookup %d needs req_id_cap >= %d and keys_cap >= %d bytes (%d keys); got %d and %d",
					item.LookupID, len(item.ReqID)+1, len(item.Keys)*inboundKeyLen(item), len(item.Keys), uint64(reqIDCap), uint64(keysCap))
			}
			if item.Kind == tier.InboundEvaluate && inboundKeyLen(item) < 0 {
				// Keys of mixed lengths cannot be laid out as n*key_len bytes:
				// answer MISS for all of them rather than leave the lookup hanging.
				miss := make([]tier.LookupResult, len(item.Keys))
				for i := range miss {
					miss[i] = tier.Miss
				}
				_, _ = t.AnswerInbound(item.LookupID, miss, -1, nil)
				continue
			}
			*lookupID = C.int64_t(item.LookupID)
			*kind = C.int32_t(item.Kind)
			*first = cBool(item.First)
			writeCString(reqIDBuf, reqIDCap, item.ReqID)
			if kl := inboundKeyLen(item); kl > 0 {
				dst := cBytes(unsafe.Pointer(keysBuf), kl*len(item.Keys))
				for i, k := range item.Keys {
					copy(dst[i*kl:], k)
				}
			}
			return statusOK
		}
		return nextInboundNone
	})
}

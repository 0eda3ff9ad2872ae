package main

/*
#include "peerkv.h"
*/
import "C"

import (
	"encoding/binary"
	"unsafe"

	"github.com/peerkv/peerkv/core/tier"
)

// The answer-caching calls of ABI 1.1 (peerkv.h: "Answer caching").

//export pkvgo_request_lookup_mode
func pkvgo_request_lookup_mode(h C.peerkv_handle, reqID *C.char, mode *C.int32_t, errBuf *C.char, errLen C.size_t) C.int32_t {
	return enterNode("peerkv_request_lookup_mode", h, errBuf, errLen, func(c call, t *tier.Tier) C.int32_t {
		id, rc := c.reqID(reqID)
		if rc != statusOK {
			return rc
		}
		if mode == nil {
			return c.failf(statusInvalidArgument, "mode is NULL")
		}
		*mode = C.int32_t(t.LookupMode(id))
		return statusOK
	})
}

//export pkvgo_lookup_many
func pkvgo_lookup_many(h C.peerkv_handle, nRequests C.size_t, reqIDs **C.char, counts *C.size_t, keys *C.uint8_t,
	keyLen C.size_t, results *C.int32_t, errBuf *C.char, errLen C.size_t) C.int32_t {
	return enterNode("peerkv_lookup_many", h, errBuf, errLen, func(c call, t *tier.Tier) C.int32_t {
		if nRequests == 0 {
			return c.onScheduleEnd(t)
		}
		if nRequests > maxKeysPerCall {
			return c.failf(statusInvalidArgument, "n_requests=%d exceeds the limit of %d per call", uint64(nRequests), maxKeysPerCall)
		}
		if reqIDs == nil || counts == nil {
			return c.failf(statusInvalidArgument, "req_ids or counts is NULL with n_requests=%d", uint64(nRequests))
		}
		ids := unsafe.Slice(reqIDs, int(nRequests))
		ns := unsafe.Slice(counts, int(nRequests))
		var total C.size_t
		for _, n := range ns {
			if n > maxKeysPerCall || total+n > maxKeysPerCall {
				return c.failf(statusInvalidArgument, "more than %d keys in one call", maxKeysPerCall)
			}
			total += n
		}
		all, rc := c.packedKeys(keys, keyLen, total)
		if rc != statusOK {
			return rc
		}
		if total > 0 && results == nil {
			return c.failf(statusInvalidArgument, "results is NULL with %d keys", uint64(total))
		}
		batch := make([]tier.RequestKeys, len(ids))
		at := 0
		for i, s := range ids {
			id, rc := c.reqID(s)
			if rc != statusOK {
				return rc
			}
			end := at + int(ns[i])*int(keyLen)
			batch[i] = tier.RequestKeys{ReqID: id, Keys: all[at:end:end]}
			at = end
		}
		out := []tier.LookupResult{}
		if total > 0 {
			out = unsafe.Slice((*tier.LookupResult)(unsafe.Pointer(results)), int(total))
		}
		if err := t.LookupMany(batch, int(keyLen), out); err != nil {
			return c.fail(err, statusInvalidArgument)
		}
		return statusOK
	})
}

func (c *call) onScheduleEnd(t *tier.Tier) C.int32_t {
	if err := t.OnScheduleEnd(); err != nil {
		return c.fail(err, statusInvalidArgument)
	}
	return statusOK
}

//export pkvgo_take_answers
func pkvgo_take_answers(h C.peerkv_handle, buf *C.uint8_t, bufLen C.size_t, nOut *C.size_t, errBuf *C.char, errLen C.size_t) C.int32_t {
	return enterNode("peerkv_take_answers", h, errBuf, errLen, func(c call, t *tier.Tier) C.int32_t {
		if nOut == nil {
			return c.failf(statusInvalidArgument, "n_out is NULL")
		}
		*nOut = 0
		room := int(min(bufLen, maxCBuffer))
		if buf == nil {
			room = 0
		}
		used, firstNeeds := 0, 0
		changes := t.TakeAnswers(func(ch tier.AnswerChange) bool {
			n := answerRecordLen(ch)
			if used+n > room {
				if used == 0 {
					firstNeeds = n
				}
				return false
			}
			used += n
			return true
		})
		if firstNeeds > 0 {
			*nOut = C.size_t(firstNeeds)
			return c.failf(statusBufferTooSmall, "buffer of %d bytes is too small: %d needed", uint64(bufLen), firstNeeds)
		}
		dst := cBytes(unsafe.Pointer(buf), used)
		at := 0
		for _, ch := range changes {
			at += putAnswerRecord(dst[at:], ch)
		}
		*nOut = C.size_t(at)
		return statusOK
	})
}

// answerRecordLen is the size of ch's record in peerkv_take_answers' format.
func answerRecordLen(ch tier.AnswerChange) int {
	return align4(4+len(ch.ReqID)) + 8 + align4(5*len(ch.Positions))
}

func align4(n int) int { return (n + 3) &^ 3 }

func putAnswerRecord(dst []byte, ch tier.AnswerChange) int {
	le := binary.LittleEndian
	n := answerRecordLen(ch)
	clear(dst[:n])
	le.PutUint32(dst, uint32(len(ch.ReqID)))
	at := 4 + copy(dst[4:], ch.ReqID)
	at = align4(at)
	var flags uint32
	if ch.Failed {
		flags = 1
	}
	le.PutUint32(dst[at:], flags)
	le.PutUint32(dst[at+4:], uint32(len(ch.Positions)))
	at += 8
	for _, pos := range ch.Positions {
		le.PutUint32(dst[at:], uint32(pos))
		at += 4
	}
	for _, r := range ch.Results {
		dst[at] = byte(r)
		at++
	}
	return n
}

//export pkvgo_news
func pkvgo_news(h C.peerkv_handle, words *unsafe.Pointer, errBuf *C.char, errLen C.size_t) C.int32_t {
	return enterNode("peerkv_news", h, errBuf, errLen, func(c call, t *tier.Tier) C.int32_t {
		if words == nil {
			return c.failf(statusInvalidArgument, "words is NULL")
		}
		addr := t.NewsAddr()
		if addr == nil {
			return c.failf(statusUnavailable, "the news page could not be mapped; call in instead")
		}
		*words = addr
		return statusOK
	})
}

package main

/*
#include "peerkv.h"
*/
import "C"

import (
	"encoding/json"
	"math/bits"
	"unsafe"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/data"
	corenode "github.com/peerkv/peerkv/core/node"
	"github.com/peerkv/peerkv/core/tier"
)

// Each pkvgo_* export backs the peerkv_* symbol of the same suffix; the C
// wrapper in wrappers.c has already refused forked children. Each is one
// call of enter or enterNode (guard.go: the panic guard, the poison check,
// the handle), whose body decodes, calls the core and maps the error.

//export pkvgo_version
func pkvgo_version(buf *C.char, bufLen C.size_t) C.int32_t {
	return enter("peerkv_version", nil, 0, func(c call) C.int32_t {
		if !writeCString(buf, bufLen, versionString()) {
			return statusBufferTooSmall
		}
		return statusOK
	})
}

//export pkvgo_info
func pkvgo_info(buf *C.char, bufLen C.size_t, needed *C.size_t, errBuf *C.char, errLen C.size_t) C.int32_t {
	return enter("peerkv_info", errBuf, errLen, func(c call) C.int32_t {
		doc, err := json.Marshal(hostInfo())
		if err != nil {
			return c.fail(err, statusInternal)
		}
		return c.writeJSON(doc, buf, bufLen, needed)
	})
}

//export pkvgo_create
func pkvgo_create(abiMajor C.uint32_t, region unsafe.Pointer, numRows, rowLen C.uint64_t, options *C.char,
	out *C.peerkv_handle, errBuf *C.char, errLen C.size_t) C.int32_t {
	return enter("peerkv_create", errBuf, errLen, func(c call) C.int32_t {
		if abiMajor != C.PEERKV_ABI_VERSION_MAJOR {
			return c.failf(statusABIMismatch, "caller was built for ABI major %d; this library implements ABI %d.%d",
				uint32(abiMajor), C.PEERKV_ABI_VERSION_MAJOR, C.PEERKV_ABI_VERSION_MINOR)
		}
		if out == nil {
			return c.failf(statusInvalidArgument, "out is NULL")
		}
		*out = 0
		hi, size := bits.Mul64(uint64(numRows), uint64(rowLen))
		if numRows == 0 || rowLen == 0 || hi != 0 || size > uint64(^uint(0)>>1) {
			return c.failf(statusInvalidArgument, "region of num_rows=%d x row_len=%d is empty or too large", uint64(numRows), uint64(rowLen))
		}
		if region == nil {
			return c.failf(statusInvalidArgument, "region is NULL")
		}
		var opts []byte
		if options != nil {
			opts = []byte(C.GoString(options))
		}
		cfg, err := config.FromJSON(opts)
		if err != nil {
			return c.fail(err, statusInvalidArgument)
		}
		// The region is host memory that outlives the handle (header contract).
		reg := data.Region{Mem: unsafe.Slice((*byte)(region), int(size)), RowLen: uint64(rowLen)}
		t, err := corenode.Open(cfg, reg)
		if err != nil {
			return c.fail(err, statusTransport)
		}
		*out = C.peerkv_handle(handles.add(&node{tier: t}))
		return statusOK
	})
}

//export pkvgo_request_start
func pkvgo_request_start(h C.peerkv_handle, reqID, paramsJSON *C.char, policy *C.int32_t,
	errBuf *C.char, errLen C.size_t) C.int32_t {
	return enterNode("peerkv_request_start", h, errBuf, errLen, func(c call, t *tier.Tier) C.int32_t {
		id, rc := c.reqID(reqID)
		if rc != statusOK {
			return rc
		}
		if policy == nil {
			return c.failf(statusInvalidArgument, "policy is NULL")
		}
		var raw []byte
		if paramsJSON != nil {
			raw = []byte(C.GoString(paramsJSON))
		}
		pol, err := t.StartRequest(id, raw)
		if err != nil {
			return c.fail(err, statusBadParams)
		}
		*policy = C.int32_t(pol)
		return statusOK
	})
}

//export pkvgo_lookup
func pkvgo_lookup(h C.peerkv_handle, reqID *C.char, keys *C.uint8_t, keyLen, n C.size_t, results *C.int32_t,
	errBuf *C.char, errLen C.size_t) C.int32_t {
	return enterNode("peerkv_lookup", h, errBuf, errLen, func(c call, t *tier.Tier) C.int32_t {
		id, rc := c.reqID(reqID)
		if rc != statusOK {
			return rc
		}
		ks, rc := c.keys(keys, keyLen, n)
		if rc != statusOK {
			return rc
		}
		if n > 0 && results == nil {
			return c.failf(statusInvalidArgument, "results is NULL with n=%d", uint64(n))
		}
		out := []tier.LookupResult{}
		if n > 0 {
			out = unsafe.Slice((*tier.LookupResult)(unsafe.Pointer(results)), int(n))
		}
		if err := t.Lookup(id, ks, out); err != nil {
			return c.fail(err, statusInvalidArgument)
		}
		return statusOK
	})
}

//export pkvgo_on_schedule_end
func pkvgo_on_schedule_end(h C.peerkv_handle, errBuf *C.char, errLen C.size_t) C.int32_t {
	return enterNode("peerkv_on_schedule_end", h, errBuf, errLen, func(c call, t *tier.Tier) C.int32_t {
		return c.onScheduleEnd(t)
	})
}

// submit decodes a load or store job and hands it to the tier.
func (c *call) submit(t *tier.Tier, reqID *C.char, jobID C.int64_t, keys *C.uint8_t, keyLen, n C.size_t,
	slots *C.int64_t, do func(t *tier.Tier, id string, job int64, ks [][]byte, ss []int64) error) C.int32_t {
	id, rc := c.reqID(reqID)
	if rc != statusOK {
		return rc
	}
	ks, rc := c.keys(keys, keyLen, n)
	if rc != statusOK {
		return rc
	}
	ss, rc := c.slots("slots", slots, n)
	if rc != statusOK {
		return rc
	}
	if err := do(t, id, int64(jobID), ks, ss); err != nil {
		return c.fail(err, statusInvalidArgument)
	}
	return statusOK
}

//export pkvgo_submit_load
func pkvgo_submit_load(h C.peerkv_handle, reqID *C.char, jobID C.int64_t, keys *C.uint8_t, keyLen, n C.size_t,
	slots *C.int64_t, errBuf *C.char, errLen C.size_t) C.int32_t {
	return enterNode("peerkv_submit_load", h, errBuf, errLen, func(c call, t *tier.Tier) C.int32_t {
		return c.submit(t, reqID, jobID, keys, keyLen, n, slots, (*tier.Tier).SubmitLoad)
	})
}

//export pkvgo_submit_store
func pkvgo_submit_store(h C.peerkv_handle, reqID *C.char, jobID C.int64_t, keys *C.uint8_t, keyLen, n C.size_t,
	slots *C.int64_t, errBuf *C.char, errLen C.size_t) C.int32_t {
	return enterNode("peerkv_submit_store", h, errBuf, errLen, func(c call, t *tier.Tier) C.int32_t {
		return c.submit(t, reqID, jobID, keys, keyLen, n, slots, (*tier.Tier).SubmitStore)
	})
}

//export pkvgo_get_finished
func pkvgo_get_finished(h C.peerkv_handle, out *C.peerkv_job_result, capacity C.size_t, nOut *C.size_t,
	errBuf *C.char, errLen C.size_t) C.int32_t {
	return enterNode("peerkv_get_finished", h, errBuf, errLen, func(c call, t *tier.Tier) C.int32_t {
		if nOut == nil {
			return c.failf(statusInvalidArgument, "n_out is NULL")
		}
		*nOut = 0
		if capacity == 0 {
			return statusOK
		}
		if out == nil {
			return c.failf(statusInvalidArgument, "out is NULL with cap=%d", uint64(capacity))
		}
		if capacity > maxKeysPerCall {
			capacity = maxKeysPerCall
		}
		dst := unsafe.Slice(out, int(capacity))
		done := t.GetFinished(int(capacity))
		for i, r := range done {
			dst[i] = C.peerkv_job_result{
				job_id:  C.int64_t(r.JobID),
				success: cBool(r.Success),
				is_load: cBool(r.IsLoad),
				bytes:   C.int64_t(r.Bytes),
				seconds: C.double(r.Duration.Seconds()),
			}
		}
		*nOut = C.size_t(len(done))
		return statusOK
	})
}

func cBool(b bool) C.int32_t {
	if b {
		return 1
	}
	return 0
}

//export pkvgo_answer_inbound
func pkvgo_answer_inbound(h C.peerkv_handle, lookupID C.int64_t, results *C.int32_t, n C.size_t, pinJobID C.int64_t,
	pinSlots *C.int64_t, nPins C.size_t, finished *C.int32_t, errBuf *C.char, errLen C.size_t) C.int32_t {
	return enterNode("peerkv_answer_inbound", h, errBuf, errLen, func(c call, t *tier.Tier) C.int32_t {
		if finished == nil {
			return c.failf(statusInvalidArgument, "finished is NULL")
		}
		*finished = 0
		if n > maxKeysPerCall {
			return c.failf(statusInvalidArgument, "n=%d exceeds the limit of %d per call", uint64(n), maxKeysPerCall)
		}
		if n > 0 && results == nil {
			return c.failf(statusInvalidArgument, "results is NULL with n=%d", uint64(n))
		}
		res := []tier.LookupResult{}
		if n > 0 {
			res = append(res, unsafe.Slice((*tier.LookupResult)(unsafe.Pointer(results)), int(n))...)
		}
		pins, rc := c.slots("pin_slots", pinSlots, nPins)
		if rc != statusOK {
			return rc
		}
		done, err := t.AnswerInbound(int64(lookupID), res, int64(pinJobID), pins)
		if err != nil {
			return c.fail(err, statusInvalidArgument)
		}
		*finished = cBool(done)
		return statusOK
	})
}

//export pkvgo_request_finish
func pkvgo_request_finish(h C.peerkv_handle, reqID *C.char, errBuf *C.char, errLen C.size_t) C.int32_t {
	return enterNode("peerkv_request_finish", h, errBuf, errLen, func(c call, t *tier.Tier) C.int32_t {
		id, rc := c.reqID(reqID)
		if rc != statusOK {
			return rc
		}
		if err := t.FinishRequest(id); err != nil {
			return c.fail(err, statusInvalidArgument)
		}
		return statusOK
	})
}

//export pkvgo_has_pending_work
func pkvgo_has_pending_work(h C.peerkv_handle) C.int32_t {
	return enterNode("peerkv_has_pending_work", h, nil, 0, func(c call, t *tier.Tier) C.int32_t {
		return cBool(t.HasPendingWork())
	})
}

//export pkvgo_notify_fd
func pkvgo_notify_fd(h C.peerkv_handle, errBuf *C.char, errLen C.size_t) C.int32_t {
	return enterNode("peerkv_notify_fd", h, errBuf, errLen, func(c call, t *tier.Tier) C.int32_t {
		fd, err := t.NotifyFD()
		if err != nil {
			return c.fail(err, statusUnavailable)
		}
		return C.int32_t(fd)
	})
}

//export pkvgo_drain
func pkvgo_drain(h C.peerkv_handle, errBuf *C.char, errLen C.size_t) C.int32_t {
	return enterNode("peerkv_drain", h, errBuf, errLen, func(c call, t *tier.Tier) C.int32_t {
		if err := t.Drain(); err != nil {
			return c.fail(err, statusTimeout)
		}
		return statusOK
	})
}

//export pkvgo_stats
func pkvgo_stats(h C.peerkv_handle, buf *C.char, bufLen C.size_t, needed *C.size_t, errBuf *C.char, errLen C.size_t) C.int32_t {
	return enterNode("peerkv_stats", h, errBuf, errLen, func(c call, t *tier.Tier) C.int32_t {
		st := t.HostStats()
		doc, err := json.Marshal(st)
		if err != nil {
			return c.fail(err, statusInternal)
		}
		rc := c.writeJSON(doc, buf, bufLen, needed)
		if rc == statusOK && st.Peers != nil {
			t.PeersDelivered()
		}
		return rc
	})
}

//export pkvgo_take_logs
func pkvgo_take_logs(h C.peerkv_handle, buf *C.char, bufLen C.size_t, nOut *C.size_t) C.int32_t {
	return enterNode("peerkv_take_logs", h, nil, 0, func(c call, t *tier.Tier) C.int32_t {
		if nOut == nil {
			return statusInvalidArgument
		}
		*nOut = 0
		if buf == nil || bufLen < 2 {
			writeCString(buf, bufLen, "")
			return statusOK
		}
		logs := t.TakeLogs(int(min(bufLen, maxCBuffer)) - 1)
		writeCString(buf, bufLen, string(logs))
		*nOut = C.size_t(len(logs))
		return statusOK
	})
}

//export pkvgo_shutdown
func pkvgo_shutdown(h C.peerkv_handle, errBuf *C.char, errLen C.size_t) C.int32_t {
	return enter("peerkv_shutdown", errBuf, errLen, func(c call) C.int32_t {
		nd, err := handles.shuttingDown(int64(h))
		if err != nil {
			return c.fail(err, statusUnknownHandle)
		}
		if nd == nil { // destroyed and torn down already: the one teardown is done
			return statusOK
		}
		if err := nd.tier.Shutdown(); err != nil {
			return c.fail(err, statusTimeout)
		}
		return statusOK
	})
}

//export pkvgo_destroy
func pkvgo_destroy(h C.peerkv_handle, errBuf *C.char, errLen C.size_t) C.int32_t {
	return enter("peerkv_destroy", errBuf, errLen, func(c call) C.int32_t {
		// The handle leaves the table first so no new call can reach a node
		// that is shutting down.
		nd, released, err := handles.remove(int64(h))
		if err != nil {
			return c.fail(err, statusUnknownHandle)
		}
		if nd == nil { // destroyed and torn down already
			return statusOK
		}
		// A concurrent destroy of the same handle waits here for the one
		// teardown too: no caller returns while rows may still land.
		err = nd.tier.Shutdown()
		// The notification fd outlives peerkv_shutdown (a host waiter wakes on
		// its last signal) and ends with the handle. Idempotent for the second
		// destroy that waited on the same teardown.
		_ = nd.tier.CloseNotify() // close(2) of an eventfd fails only for a bad fd
		if !released {
			handles.retired(int64(h))
		}
		if err != nil {
			return c.fail(err, statusTimeout)
		}
		return statusOK
	})
}

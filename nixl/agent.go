package nixl

/*
#include <stdlib.h>
#include "capi.h"
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// StatusError is a failed nixl_capi_* call.
type StatusError struct {
	Op   string // the NIXL call, e.g. "post_xfer_req"
	Code int    // nixl_capi_status_t
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("nixl %s: %s", e.Op, statusName(e.Code))
}

// statusName names nixl_capi_status_t values (wrapper.h). Since nixl#2114 a
// remote disconnect or cancel still maps to ERROR_BACKEND.
func statusName(code int) string {
	switch code {
	case 0:
		return "SUCCESS"
	case 1:
		return "IN_PROG"
	case -1:
		return "ERROR_INVALID_PARAM"
	case -2:
		return "ERROR_BACKEND"
	case -3:
		return "ERROR_INVALID_STATE"
	case -4:
		return "ERROR_EXCEPTION"
	case -5:
		return "ERROR_NO_TELEMETRY"
	case -6:
		return "ERROR_NOT_FOUND"
	}
	return fmt.Sprintf("status %d", code)
}

func check(op string, st C.nixl_status) error {
	if st == C.PKV_NIXL_SUCCESS {
		return nil
	}
	return &StatusError{Op: op, Code: int(st)}
}

// agent wraps one NIXL agent. NIXL agents are not thread-safe: every method
// must be called from the transport's owner goroutine only.
type agent struct {
	h        C.nixl_agent
	name     string
	backends []C.nixl_backend
	reg      C.nixl_reg_dlist // kept for deregistration
}

type agentConfig struct {
	progressThread  bool
	progressDelayUs uint64 // the progress thread's poll timeout; 0 = none (it spins)
}

func newAgent(name string, cfg agentConfig) (*agent, error) {
	cName := C.CString(name)
	defer C.free(unsafe.Pointer(cName))
	ccfg := C.nixl_agent_config{
		enable_prog_thread: C.bool(cfg.progressThread),
		pthr_delay_us:      C.uint64_t(cfg.progressDelayUs),
		thread_sync:        C.PKV_NIXL_THREAD_SYNC_NONE,
	}
	a := &agent{name: name}
	if err := check("create_configured_agent", C.pkv_nixl_create_configured_agent(cName, &ccfg, &a.h)); err != nil {
		return nil, err
	}
	return a, nil
}

func (a *agent) createBackend(plugin string, params map[string]string) error {
	var p C.nixl_params
	if err := check("create_params", C.pkv_nixl_create_params(&p)); err != nil {
		return err
	}
	defer C.pkv_nixl_destroy_params(p)
	for k, v := range params {
		ck, cv := C.CString(k), C.CString(v)
		st := C.pkv_nixl_params_add(p, ck, cv)
		C.free(unsafe.Pointer(ck))
		C.free(unsafe.Pointer(cv))
		if err := check("params_add", st); err != nil {
			return err
		}
	}
	cPlugin := C.CString(plugin)
	defer C.free(unsafe.Pointer(cPlugin))
	var b C.nixl_backend
	if err := check("create_backend "+plugin, C.pkv_nixl_create_backend(a.h, cPlugin, p, &b)); err != nil {
		return err
	}
	a.backends = append(a.backends, b)
	return nil
}

// registerDRAM registers [base, base+size) with every backend that takes DRAM.
func (a *agent) registerDRAM(base uintptr, size uint64) error {
	var d C.nixl_reg_dlist
	if err := check("create_reg_dlist", C.pkv_nixl_create_reg_dlist(C.PKV_NIXL_MEM_DRAM, &d)); err != nil {
		return err
	}
	err := check("reg_dlist_add_desc", C.pkv_nixl_reg_dlist_add_desc(d, C.uintptr_t(base), C.size_t(size), 0))
	if err == nil {
		err = check("register_mem", C.pkv_nixl_register_mem(a.h, d))
	}
	if err != nil {
		C.pkv_nixl_destroy_reg_dlist(d)
		return err
	}
	a.reg = d
	return nil
}

// prepRows prepares one descriptor per row of a region owned by agentName
// ("" for this agent's own memory, NIXL_INIT_AGENT).
func (a *agent) prepRows(agentName string, base uintptr, numRows, rowLen uint64) (C.nixl_dlist_handle, error) {
	var d C.nixl_xfer_dlist
	if err := check("create_xfer_dlist", C.pkv_nixl_create_xfer_dlist(C.PKV_NIXL_MEM_DRAM, &d)); err != nil {
		return nil, err
	}
	// prep_xfer_dlist copies the descriptors; the list itself is temporary.
	defer C.pkv_nixl_destroy_xfer_dlist(d)
	if err := check("xfer_dlist_add_desc", C.pkv_nixl_add_row_descs(d, C.uintptr_t(base), C.uint64_t(numRows), C.uint64_t(rowLen))); err != nil {
		return nil, err
	}
	cName := C.CString(agentName)
	defer C.free(unsafe.Pointer(cName))
	var h C.nixl_dlist_handle
	if err := check("prep_xfer_dlist", C.pkv_nixl_prep_xfer_dlist(a.h, cName, d, &h)); err != nil {
		return nil, err
	}
	return h, nil
}

func (a *agent) releaseDlist(h C.nixl_dlist_handle) error {
	return check("release_xfer_dlist_handle", C.pkv_nixl_release_xfer_dlist_handle(a.h, h))
}

func (a *agent) localMD() ([]byte, error) {
	var p unsafe.Pointer
	var n C.size_t
	if err := check("get_local_md", C.pkv_nixl_get_local_md(a.h, &p, &n)); err != nil {
		return nil, err
	}
	defer C.free(p)
	return C.GoBytes(p, C.int(n)), nil
}

// loadRemoteMD loads a peer's metadata blob and returns its agent name.
func (a *agent) loadRemoteMD(md []byte) (string, error) {
	if len(md) == 0 {
		return "", &StatusError{Op: "load_remote_md", Code: -1}
	}
	var cName *C.char
	st := C.pkv_nixl_load_remote_md(a.h, unsafe.Pointer(&md[0]), C.size_t(len(md)), &cName)
	if err := check("load_remote_md", st); err != nil {
		return "", err
	}
	defer C.free(unsafe.Pointer(cName))
	return C.GoString(cName), nil
}

func (a *agent) invalidateRemote(name string) error {
	cName := C.CString(name)
	defer C.free(unsafe.Pointer(cName))
	return check("invalidate_remote_md", C.pkv_nixl_invalidate_remote_md(a.h, cName))
}

// postWrite makes and posts one WRITE of local rows src[i] into remote rows
// dst[i]. done reports a transfer NIXL finished while posting.
func (a *agent) postWrite(local, remote C.nixl_dlist_handle, src, dst []C.int) (req C.nixl_xfer_req, done bool, err error) {
	st := C.pkv_nixl_make_xfer_req(a.h, C.PKV_NIXL_XFER_WRITE, local, &src[0], remote, &dst[0], C.size_t(len(src)), &req)
	if err := check("make_xfer_req", st); err != nil {
		return nil, false, err
	}
	switch st = C.pkv_nixl_post_xfer_req(a.h, req); st {
	case C.PKV_NIXL_SUCCESS:
		return req, true, nil
	case C.PKV_NIXL_IN_PROG:
		return req, false, nil
	}
	postErr := check("post_xfer_req", st)
	if relErr := a.releaseReq(req); relErr != nil {
		return req, false, fmt.Errorf("%w (and %v)", postErr, relErr)
	}
	return nil, false, postErr
}

// status polls a posted request: done, still running, or failed.
func (a *agent) status(req C.nixl_xfer_req) (done bool, err error) {
	switch st := C.pkv_nixl_get_xfer_status(a.h, req); st {
	case C.PKV_NIXL_SUCCESS:
		return true, nil
	case C.PKV_NIXL_IN_PROG:
		return false, nil
	default:
		return false, check("get_xfer_status", st)
	}
}

// releaseReq releases a request (cancelling it if still running) and frees
// its handle. On error the handle stays valid and may be released again.
func (a *agent) releaseReq(req C.nixl_xfer_req) error {
	if err := check("release_xfer_req", C.pkv_nixl_release_xfer_req(a.h, req)); err != nil {
		return err
	}
	return check("destroy_xfer_req", C.pkv_nixl_destroy_xfer_req(req))
}

// destroy deregisters memory and destroys the agent; requests and dlists
// must have been released.
func (a *agent) destroy() error {
	var first error
	keep := func(err error) {
		if first == nil {
			first = err
		}
	}
	if a.reg != nil {
		keep(check("deregister_mem", C.pkv_nixl_deregister_mem(a.h, a.reg)))
		C.pkv_nixl_destroy_reg_dlist(a.reg)
		a.reg = nil
	}
	keep(check("destroy_agent", C.pkv_nixl_destroy_agent(a.h)))
	// Backend handles are plain wrappers; the agent owned the engines.
	for _, b := range a.backends {
		C.pkv_nixl_destroy_backend(b)
	}
	a.backends = nil
	a.h = nil
	return first
}

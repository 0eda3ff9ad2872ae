package main

/*
#include "peerkv.h"
*/
import "C"

import (
	"errors"

	corenode "github.com/peerkv/peerkv/core/node"
	"github.com/peerkv/peerkv/core/params"
	"github.com/peerkv/peerkv/core/tier"
)

// Status codes, taken from peerkv.h by cgo so they cannot drift.
const (
	statusOK              = C.int32_t(C.PEERKV_OK)
	statusInvalidArgument = C.int32_t(C.PEERKV_ERR_INVALID_ARGUMENT)
	statusUnknownHandle   = C.int32_t(C.PEERKV_ERR_UNKNOWN_HANDLE)
	statusBadParams       = C.int32_t(C.PEERKV_ERR_BAD_PARAMS)
	statusUnknownRequest  = C.int32_t(C.PEERKV_ERR_UNKNOWN_REQUEST)
	statusBufferTooSmall  = C.int32_t(C.PEERKV_ERR_BUFFER_TOO_SMALL)
	statusTransport       = C.int32_t(C.PEERKV_ERR_TRANSPORT)
	statusClosed          = C.int32_t(C.PEERKV_ERR_CLOSED)
	statusInternal        = C.int32_t(C.PEERKV_ERR_INTERNAL)
	statusTimeout         = C.int32_t(C.PEERKV_ERR_TIMEOUT)
	statusDuplicate       = C.int32_t(C.PEERKV_ERR_DUPLICATE)
	statusUnavailable     = C.int32_t(C.PEERKV_ERR_UNAVAILABLE)
	statusABIMismatch     = C.int32_t(C.PEERKV_ERR_ABI_MISMATCH)
)

// errUnknownHandle is returned by the handle table.
var errUnknownHandle = errors.New("unknown handle (never created, or destroyed)")

// statusFor maps a core error to a status code; fallback is used when the
// error carries no known sentinel (each call knows its most likely cause).
func statusFor(err error, fallback C.int32_t) C.int32_t {
	switch {
	case errors.Is(err, errUnknownHandle):
		return statusUnknownHandle
	case errors.Is(err, tier.ErrBadParams), errors.Is(err, params.ErrForbidden), errors.Is(err, params.ErrMalformed):
		return statusBadParams
	case errors.Is(err, tier.ErrUnknownRequest):
		return statusUnknownRequest
	case errors.Is(err, tier.ErrDuplicate):
		return statusDuplicate
	case errors.Is(err, tier.ErrInternal):
		return statusInternal
	case errors.Is(err, tier.ErrClosed):
		return statusClosed
	case errors.Is(err, tier.ErrTimeout):
		return statusTimeout
	case errors.Is(err, corenode.ErrUnavailable):
		return statusUnavailable
	case errors.Is(err, corenode.ErrTransport):
		return statusTransport
	case errors.Is(err, tier.ErrInvalidArgument):
		return statusInvalidArgument
	}
	return fallback
}

package main

/*
#include "peerkv.h"
*/
import "C"

import (
	"encoding/json"
	"math"
	"time"

	"github.com/peerkv/peerkv/core/tier"
)

//export pkvgo_probe
func pkvgo_probe(h C.peerkv_handle, peer *C.char, timeoutS C.double, buf *C.char, bufLen C.size_t, needed *C.size_t,
	errBuf *C.char, errLen C.size_t) C.int32_t {
	return enterNode("peerkv_probe", h, errBuf, errLen, func(c call, t *tier.Tier) C.int32_t {
		if peer == nil || C.GoString(peer) == "" {
			return c.failf(statusInvalidArgument, "peer is NULL or empty (want host:port)")
		}
		timeout := float64(timeoutS)
		if math.IsNaN(timeout) || timeout <= 0 || timeout > 600 {
			return c.failf(statusInvalidArgument, "timeout_s=%v is not in (0, 600]", timeout)
		}
		res, err := t.Probe(C.GoString(peer), time.Duration(timeout*float64(time.Second)))
		if err != nil {
			return c.fail(err, statusInvalidArgument)
		}
		doc, err := json.Marshal(res)
		if err != nil {
			return c.fail(err, statusInternal)
		}
		return c.writeJSON(doc, buf, bufLen, needed)
	})
}

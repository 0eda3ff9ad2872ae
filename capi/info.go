package main

/*
#include "peerkv.h"
*/
import "C"

import (
	"fmt"
	"sync"

	"github.com/peerkv/peerkv/core/gpuinfo"
	"github.com/peerkv/peerkv/core/node"
)

// hostDescription is peerkv_info's JSON document.
type hostDescription struct {
	Version string        `json:"version"`
	ABI     string        `json:"abi"`
	GPUs    []gpuinfo.GPU `json:"gpus"`
	NVML    string        `json:"nvml"`
	NIXL    string        `json:"nixl"`
}

// GPUs and NIXL do not change while the process runs; probing them (NVML
// init, dlopen) is slow, so it happens once.
var hostInfo = sync.OnceValue(func() hostDescription {
	gpus := gpuinfo.Discover()
	return hostDescription{
		Version: versionString(),
		ABI:     fmt.Sprintf("%d.%d", C.PEERKV_ABI_VERSION_MAJOR, C.PEERKV_ABI_VERSION_MINOR),
		GPUs:    gpus.GPUs,
		NVML:    gpus.Status,
		NIXL:    node.NixlStatus(),
	}
})

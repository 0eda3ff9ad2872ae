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

// GPUs do not change while the process runs and probing them (NVML init)
// is slow, so it happens once. NIXL is asked each time: a peer created
// since may have loaded it from a path given in its options.
var gpus = sync.OnceValue(gpuinfo.Discover)

func hostInfo() hostDescription {
	g := gpus()
	return hostDescription{
		Version: versionString(),
		ABI:     fmt.Sprintf("%d.%d", C.PEERKV_ABI_VERSION_MAJOR, C.PEERKV_ABI_VERSION_MINOR),
		GPUs:    g.GPUs,
		NVML:    g.Status,
		NIXL:    node.NixlStatus(),
	}
}

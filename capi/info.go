package main

/*
#include "peerkv.h"
*/
import "C"

import (
	"fmt"
	"runtime"
	"sync"

	"github.com/peerkv/peerkv/core/contract"
	"github.com/peerkv/peerkv/core/gpuinfo"
	corenode "github.com/peerkv/peerkv/core/node"
)

// hostDescription is peerkv_info's JSON document.
type hostDescription struct {
	Version string        `json:"version"`
	ABI     string        `json:"abi"`
	GPUs    []gpuinfo.GPU `json:"gpus"`
	NVML    string        `json:"nvml"`
	NIXL    string        `json:"nixl"`
	// DataPaths: per path, "ok ..." or why this host cannot serve it.
	DataPaths map[string]string `json:"data_paths"`
	// GoMaxProcs is the Go runtime's size now; GoMaxProcsDefault what a
	// node without go_max_procs sets (core/node/procs.go).
	GoMaxProcs        int `json:"go_max_procs"`
	GoMaxProcsDefault int `json:"go_max_procs_default"`
	// OptionsSchema is the digest of the options schema and metric shapes
	// this library was built with (core/contract), to compare with the
	// Python package's copy.
	OptionsSchema string `json:"options_schema"`
}

// GPUs do not change while the process runs and probing them (NVML init)
// is slow, so it happens once. NIXL is asked each time: a node created
// since may have loaded it from a path given in its options.
var gpus = sync.OnceValue(gpuinfo.Discover)

func hostInfo() hostDescription {
	g := gpus()
	return hostDescription{
		Version:           versionString(),
		ABI:               fmt.Sprintf("%d.%d", C.PEERKV_ABI_VERSION_MAJOR, C.PEERKV_ABI_VERSION_MINOR),
		GPUs:              g.GPUs,
		NVML:              g.Status,
		NIXL:              corenode.NixlStatus(),
		DataPaths:         corenode.DataPathStatus(),
		GoMaxProcs:        runtime.GOMAXPROCS(0),
		GoMaxProcsDefault: corenode.DefaultGoMaxProcs(),
		OptionsSchema:     contract.Digest(),
	}
}

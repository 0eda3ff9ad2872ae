// Package gpuinfo lists this host's NVIDIA GPUs through NVML (go-nvml).
//
// Discovery is informational (labels, NUMA affinity): the P2P data path never
// touches GPU memory. It therefore never fails and never crashes: without a
// driver (libnvidia-ml.so.1 absent) it returns no GPUs and says why.
//
// Loading note: go-nvml leaves its nvml* symbols undefined in the binary and
// resolves them lazily after Init has dlopen'ed the driver library
// RTLD_GLOBAL. A shared library containing this package must therefore be
// loaded with lazy binding (ctypes: mode=os.RTLD_LAZY; never LD_BIND_NOW).
// Functions newer than the oldest supported driver are probed with
// LookupSymbol first, because calling a missing one aborts the process.
package gpuinfo

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// StatusOK is the Status of a discovery that reached the driver.
const StatusOK = "ok"

// GPU is one device as NVML reports it.
type GPU struct {
	Index int    `json:"index"`
	Name  string `json:"name"`
	UUID  string `json:"uuid"`
	// NUMANode is the device's NUMA node, -1 when unknown or unsupported.
	NUMANode int `json:"numa_node"`
}

// Report is the outcome of one discovery.
type Report struct {
	GPUs []GPU `json:"gpus"` // never nil
	// Status is StatusOK, or why NVML gave no (or partial) information.
	Status string `json:"nvml"`
}

// Discover queries the system's NVML library.
func Discover() Report { return DiscoverWith(nvml.New()) }

// DiscoverWith queries lib (a real library or a mock).
func DiscoverWith(lib nvml.Interface) (rep Report) {
	rep = Report{GPUs: []GPU{}, Status: StatusOK}
	// go-nvml is cgo over a foreign library; a panic here must not take the
	// host process down for what is only informational.
	defer func() {
		if r := recover(); r != nil {
			rep = Report{GPUs: []GPU{}, Status: fmt.Sprintf("NVML query panicked: %v", r)}
		}
	}()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
			return Report{GPUs: []GPU{}, Status: "NVML unavailable: libnvidia-ml.so.1 not found (no NVIDIA driver)"}
		}
		return Report{GPUs: []GPU{}, Status: "NVML init failed: " + describe(ret)}
	}
	defer lib.Shutdown()

	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return Report{GPUs: []GPU{}, Status: "NVML device count failed: " + describe(ret)}
	}
	hasNUMA := lib.Extensions().LookupSymbol("nvmlDeviceGetNumaNodeId") == nil
	for i := 0; i < count; i++ {
		dev, ret := lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			rep.Status = fmt.Sprintf("NVML device %d: %s", i, describe(ret))
			continue
		}
		gpu := GPU{Index: i, NUMANode: -1}
		if name, ret := dev.GetName(); ret == nvml.SUCCESS {
			gpu.Name = name
		}
		if uuid, ret := dev.GetUUID(); ret == nvml.SUCCESS {
			gpu.UUID = uuid
		}
		if hasNUMA {
			if node, ret := dev.GetNumaNodeId(); ret == nvml.SUCCESS {
				gpu.NUMANode = node
			}
		}
		rep.GPUs = append(rep.GPUs, gpu)
	}
	return rep
}

// describe names an NVML return code; Return.Error works without the library.
func describe(ret nvml.Return) string { return fmt.Sprintf("%s (%d)", ret.Error(), int(ret)) }

package gpuinfo

import (
	"errors"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestMissingDriverLibraryGivesEmptyListAndReason(t *testing.T) {
	lib := nvml.New(nvml.WithLibraryPath("/nonexistent/libnvidia-ml.so.1"))
	rep := DiscoverWith(lib)
	require.NotNil(t, rep.GPUs)
	assert.Empty(t, rep.GPUs)
	assert.Contains(t, rep.Status, "libnvidia-ml.so.1 not found")
}

func TestDiscoverOnThisHostNeverFails(t *testing.T) {
	rep := Discover()
	require.NotNil(t, rep.GPUs)
	if rep.Status != StatusOK {
		assert.Empty(t, rep.GPUs, "a failed discovery must not list GPUs")
	}
	t.Logf("this host: status=%q gpus=%d", rep.Status, len(rep.GPUs))
}

func fakeDevice(name, uuid string, numa int) *mock.Device {
	return &mock.Device{
		GetNameFunc:       func() (string, nvml.Return) { return name, nvml.SUCCESS },
		GetUUIDFunc:       func() (string, nvml.Return) { return uuid, nvml.SUCCESS },
		GetNumaNodeIdFunc: func() (int, nvml.Return) { return numa, nvml.SUCCESS },
	}
}

func fakeLibrary(devs []*mock.Device, numaSymbol bool) *mock.Interface {
	return &mock.Interface{
		InitFunc:           func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:       func() nvml.Return { return nvml.SUCCESS },
		DeviceGetCountFunc: func() (int, nvml.Return) { return len(devs), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			return devs[i], nvml.SUCCESS
		},
		ExtensionsFunc: func() nvml.ExtendedInterface {
			return &mock.ExtendedInterface{LookupSymbolFunc: func(name string) error {
				if numaSymbol && name == "nvmlDeviceGetNumaNodeId" {
					return nil
				}
				return errors.New("undefined symbol " + name)
			}}
		},
	}
}

func TestListsEveryDeviceWithIndexNameUUIDAndNUMANode(t *testing.T) {
	lib := fakeLibrary([]*mock.Device{
		fakeDevice("NVIDIA H200", "GPU-aaaa", 0),
		fakeDevice("NVIDIA H200", "GPU-bbbb", 1),
	}, true)
	rep := DiscoverWith(lib)
	assert.Equal(t, StatusOK, rep.Status)
	assert.Equal(t, []GPU{
		{Index: 0, Name: "NVIDIA H200", UUID: "GPU-aaaa", NUMANode: 0},
		{Index: 1, Name: "NVIDIA H200", UUID: "GPU-bbbb", NUMANode: 1},
	}, rep.GPUs)
	assert.Len(t, lib.ShutdownCalls(), 1, "NVML must be shut down after a successful init")
}

func TestOldDriverWithoutNUMASymbolReportsMinusOneWithoutCallingIt(t *testing.T) {
	dev := fakeDevice("Tesla V100", "GPU-cccc", 3)
	dev.GetNumaNodeIdFunc = nil // the mock panics if called: calling a missing symbol would abort the process
	rep := DiscoverWith(fakeLibrary([]*mock.Device{dev}, false))
	assert.Equal(t, StatusOK, rep.Status)
	require.Len(t, rep.GPUs, 1)
	assert.Equal(t, -1, rep.GPUs[0].NUMANode)
	assert.Equal(t, "GPU-cccc", rep.GPUs[0].UUID)
}

func TestInitFailureOtherThanMissingLibraryNamesTheCode(t *testing.T) {
	lib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }}
	rep := DiscoverWith(lib)
	assert.Empty(t, rep.GPUs)
	assert.Contains(t, rep.Status, "ERROR_DRIVER_NOT_LOADED")
}

func TestPanicInsideNVMLIsContained(t *testing.T) {
	lib := fakeLibrary([]*mock.Device{{}}, true) // device mock with no funcs panics on GetName
	rep := DiscoverWith(lib)
	assert.Empty(t, rep.GPUs)
	assert.Contains(t, rep.Status, "panicked")
}

package main

import (
	"runtime"
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/peerkv/peerkv/core/contract"
	corenode "github.com/peerkv/peerkv/core/node"
)

func TestInfoNamesDataPathsRuntimeAndSchema(t *testing.T) {
	h := hostInfo()
	assert.Len(t, h.DataPaths, 3)
	for _, p := range []string{"shm", "nixl", "tcp"} {
		assert.NotEmpty(t, h.DataPaths[p], p)
	}
	assert.Contains(t, h.DataPaths["tcp"], "ok")
	assert.Equal(t, runtime.GOMAXPROCS(0), h.GoMaxProcs)
	assert.Equal(t, corenode.DefaultGoMaxProcs(), h.GoMaxProcsDefault)
	assert.LessOrEqual(t, h.GoMaxProcsDefault, corenode.DefaultMaxProcsCap)
	assert.Equal(t, contract.Digest(), h.OptionsSchema)
}

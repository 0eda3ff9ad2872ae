package contract

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var update = flag.Bool("update", false, "rewrite python/peerkv/_options_schema.py")

var pythonModule = filepath.Join("..", "..", "python", "peerkv", "_options_schema.py")

// PythonModule renders the Python module holding the document.
func PythonModule() []byte {
	var b bytes.Buffer
	b.WriteString(`"""The library's options schema and metric shapes, for checking a tier
configuration and declaring metrics without loading libpeerkv.so.

Generated from core/config/schema.go and core/tier/observe.go by
    go test ./core/contract -run TestPythonModuleIsCurrent -update
Do not edit: a Go test fails when this file and the Go tables differ.
"""

import json

DIGEST = "` + Digest() + `"

SCHEMA = json.loads(
    r"""
`)
	b.Write(JSON())
	b.WriteString("\n\"\"\"\n)\n")
	return b.Bytes()
}

func TestPythonModuleIsCurrent(t *testing.T) {
	want := PythonModule()
	if *update {
		require.NoError(t, os.WriteFile(pythonModule, want, 0o644))
	}
	got, err := os.ReadFile(pythonModule)
	require.NoError(t, err)
	assert.True(t, bytes.Equal(want, got),
		"%s is stale: run go test ./core/contract -run TestPythonModuleIsCurrent -update", pythonModule)
}

func TestDocumentIsSelfConsistent(t *testing.T) {
	d := Build()
	assert.Equal(t, Version, d.Version)
	assert.NotEmpty(t, d.Options)
	for _, h := range d.Histograms {
		for i := 1; i < len(h); i++ {
			assert.Less(t, h[i-1], h[i], "bucket bounds must increase")
		}
	}
	assert.False(t, strings.Contains(string(JSON()), `"""`), "the JSON must fit a raw Python string")
	assert.Len(t, Digest(), 64)
}

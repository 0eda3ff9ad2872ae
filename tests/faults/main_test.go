package faults

import (
	"flag"
	"os"
	"testing"
)

// TestMain lets many cases run at once: they spend their time waiting for
// deadlines, not computing, and the package must finish within a minute.
func TestMain(m *testing.M) {
	flag.Parse()
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit {
		_ = flag.Set("test.parallel", "48")
	}
	os.Exit(m.Run())
}

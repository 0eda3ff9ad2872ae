//go:build !race

package zmqctl

// memoryFactor scales the RSS bounds of the memory tests (see
// race_on_test.go).
const memoryFactor = 1

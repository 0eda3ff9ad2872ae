//go:build race

package zmqctl

// memoryFactor scales the RSS bounds of the memory tests: the race
// detector's shadow memory grows with what the process allocated and is
// not handed back when the Go heap is.
const memoryFactor = 3

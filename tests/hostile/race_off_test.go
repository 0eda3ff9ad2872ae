//go:build !race

package hostile

// raceEnabled: see race_on_test.go.
const raceEnabled = false

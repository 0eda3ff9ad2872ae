//go:build race

package hostile

// raceEnabled: this binary runs under the race detector, whose shadow
// memory counts in the victim's RSS.
const raceEnabled = true

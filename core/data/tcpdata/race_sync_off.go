//go:build !race

package tcpdata

// raceSync is a no-op outside race builds; see race_sync.go.
func raceSync() {}

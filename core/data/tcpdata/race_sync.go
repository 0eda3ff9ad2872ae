//go:build race

package tcpdata

import "sync/atomic"

// wireSync stands in, for the race detector, for the ordering a TCP frame
// gives between a sender and a receiver in the same process: the detector
// does not see it through sockets, and would report rows read after a
// completion as racing with the receiver that wrote them.
var wireSync atomic.Uint64

// raceSync is called after reading and before writing a frame that orders
// region accesses (a part header, an ack).
func raceSync() { wireSync.Add(1) }

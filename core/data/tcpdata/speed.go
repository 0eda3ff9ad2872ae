package tcpdata

import "time"

// linkSpeed is what one connection has shown of its speed, to size its next
// part: long enough that the ack's round trip costs little, short enough
// that a canceled transfer's part on the wire ends soon where it cannot
// be cut (partDuration; segment.go cuts it otherwise).
type linkSpeed struct {
	bytesPerSec float64       // the last part's bytes over its time from first write to ack
	ackWait     time.Duration // least time seen from a part's last write to its ack: a round trip, at least
}

// observe records one part: bytes sent from start, all written by written,
// acked at acked.
func (v *linkSpeed) observe(bytes uint64, start, written, acked time.Time) {
	if wait := acked.Sub(written); v.ackWait == 0 || wait < v.ackWait {
		v.ackWait = max(wait, time.Microsecond)
	}
	v.bytesPerSec = float64(bytes) / max(acked.Sub(start), time.Microsecond).Seconds()
}

// partBytes is the size the next part should have: what the connection
// moves in partDuration, within [minPartBytes, maxPartBytes]. The measured
// speed counts the ack's round trip as part time, so the part is sized for
// partDuration plus that wait: it then spends about partDuration on the
// link, and a connection moves partDuration / (partDuration + round trip)
// of its speed (Streams connections make up for a long round trip).
func (v *linkSpeed) partBytes() uint64 {
	if v.bytesPerSec == 0 {
		return minPartBytes
	}
	b := v.bytesPerSec * (partDuration + v.ackWait).Seconds()
	return uint64(min(max(b, minPartBytes), maxPartBytes))
}

package tcpdata

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"
)

// A segmented part (segPartMagic, sent only to a receiver whose hello
// offered featureSegments) carries its row bytes as segments, each a u32
// length and that many bytes. A length of 0 is the cancel marker: the
// writer's transfer was canceled and nothing more of the part follows. The
// receiver reads every byte before the marker, then acks statusCanceled,
// so when the writer reads that ack no byte of the part is still on its
// way: the abort it reports next can be acknowledged safely, while a part
// cut by a reset could still be read after the consumer got its rows back.

const (
	// segmentDuration is how long a segment lasts at the rate its
	// connection last took bytes: a canceled part's sender stops at the
	// end of the segment it is writing, so this bounds what it adds.
	segmentDuration = 5 * time.Millisecond
	// minSegmentBytes keeps segments' prefixes and writev calls few on a
	// slow link: 64 KiB is 5 ms of a 100 Mbit/s link.
	minSegmentBytes = 64 << 10
	// maxSegmentBytes bounds a segment (and so a writev batch) on a fast
	// link: large enough that per-segment costs stay small at GB/s (with
	// 1 MiB segments loopback measured slower than whole parts), small
	// enough that a fast link whose rate falls at once carries little more
	// of a canceled part.
	maxSegmentBytes = 4 << 20
)

// errPartCanceled is what a segmented part's reader returns at the cancel
// marker.
var errPartCanceled = errors.New("tcpdata: part canceled by its writer")

// segmentRate is how fast one connection takes segments, to size the
// next: the kernel blocks a write while more than maxUnsentBytes wait, so
// a write that blocked shows the link's rate. One that did not (room in the
// kernel's buffers) shows nothing about the link: the rate then at most
// doubles, so a slow link's segments stay small while its buffers refill.
type segmentRate struct {
	bytesPerSec float64 // 0: not measured yet
}

// observe records a segment of bytes written in took.
func (v *segmentRate) observe(bytes int, took time.Duration) {
	seen := float64(bytes) / max(took, time.Microsecond).Seconds()
	if v.bytesPerSec == 0 {
		v.bytesPerSec = minSegmentBytes / segmentDuration.Seconds() // a new connection starts small
	}
	v.bytesPerSec = min(seen, 2*v.bytesPerSec)
}

// size is the next segment's length: segmentDuration at the rate, within
// [minSegmentBytes, min(limit, maxSegmentBytes)].
func (v *segmentRate) size(limit int) int {
	if v.bytesPerSec == 0 {
		return minSegmentBytes
	}
	most := float64(max(min(limit, maxSegmentBytes), minSegmentBytes))
	return int(min(max(v.bytesPerSec*segmentDuration.Seconds(), minSegmentBytes), most))
}

// segmentReader reads a segmented part's row bytes from conn: Read returns
// only row bytes, io.EOF after the part's last, errPartCanceled at a
// cancel marker (and from then on).
type segmentReader struct {
	conn     io.Reader
	partLeft uint64 // row bytes of the part not yet read
	segLeft  uint64 // of them, in the current segment
	canceled bool
	prefix   [segHeaderLen]byte
}

func (s *segmentReader) Read(b []byte) (int, error) {
	if s.canceled {
		return 0, errPartCanceled
	}
	if s.partLeft == 0 {
		return 0, io.EOF
	}
	if s.segLeft == 0 {
		if _, err := io.ReadFull(s.conn, s.prefix[:]); err != nil {
			return 0, err
		}
		n := uint64(binary.LittleEndian.Uint32(s.prefix[:]))
		if n == 0 {
			s.canceled = true
			return 0, errPartCanceled
		}
		if n > s.partLeft {
			return 0, fmt.Errorf("%w: a segment of %d bytes where %d of the part are left", ErrProtocol, n, s.partLeft)
		}
		if n < min(minSegmentBytes, s.partLeft) {
			// Writers never send less but at a part's end: tiny segments
			// would only make reading (or discarding) the part cost more.
			return 0, fmt.Errorf("%w: a segment of %d bytes (at least %d unless it ends the part)", ErrProtocol, n, minSegmentBytes)
		}
		s.segLeft = n
	}
	if uint64(len(b)) > s.segLeft {
		b = b[:s.segLeft]
	}
	n, err := s.conn.Read(b)
	s.segLeft -= uint64(n)
	s.partLeft -= uint64(n)
	if err == io.EOF && s.partLeft > 0 {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

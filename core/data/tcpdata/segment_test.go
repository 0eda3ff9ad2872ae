package tcpdata

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/peerkv/peerkv/core/data"
)

// segments frames lengths as a writer does; data fills them with 0x5A.
func segments(lengths ...uint32) io.Reader {
	var b bytes.Buffer
	for _, n := range lengths {
		_ = binary.Write(&b, binary.LittleEndian, n)
		b.Write(bytes.Repeat([]byte{0x5A}, int(n)))
	}
	return &b
}

// A segmented part's reader returns exactly the part's row bytes across
// segments that split rows, stops at a cancel marker, and refuses a
// segment longer than what is left of the part instead of reading past it.
func TestSegmentReaderKeepsThePartInStep(t *testing.T) {
	const m = minSegmentBytes // every segment but a part's last is at least this long
	r := &segmentReader{conn: segments(m, m+5, 2), partLeft: 2*m + 7}
	got, err := io.ReadAll(r)
	require.NoError(t, err)
	assert.Equal(t, bytes.Repeat([]byte{0x5A}, 2*m+7), got)

	r = &segmentReader{conn: segments(m, 0, 6), partLeft: 2 * m}
	got, err = io.ReadAll(r)
	assert.ErrorIs(t, err, errPartCanceled)
	assert.Len(t, got, m, "the bytes before the marker, nothing after it")
	_, err = r.Read(make([]byte, 1))
	assert.ErrorIs(t, err, errPartCanceled, "and nothing after it on a later read")

	r = &segmentReader{conn: segments(m, 2*m), partLeft: m + 10}
	_, err = io.ReadAll(r)
	assert.ErrorIs(t, err, ErrProtocol, "a segment past the part's end")

	r = &segmentReader{conn: segments(3, m), partLeft: m + 3}
	_, err = io.ReadAll(r)
	assert.ErrorIs(t, err, ErrProtocol, "a tiny segment that does not end the part")

	r = &segmentReader{conn: io.MultiReader(segments(m), bytes.NewReader([]byte{5, 0, 0, 0, 1})), partLeft: m + 5}
	_, err = io.ReadAll(r)
	assert.ErrorIs(t, err, io.ErrUnexpectedEOF, "a writer gone mid-segment")
}

// A receiver that offers no segments (an older peerkv) gets whole parts:
// transfers land, and a canceled one is still reported once, after its
// part on the wire ran to its end.
func TestAReceiverWithoutSegmentsGetsWholeParts(t *testing.T) {
	const rows = 64
	src, dst := randomRegion(t, 2*rows), sentinelRegion(2*rows)
	a := newTransport(t, "a", src, nil)
	b := newTransport(t, "b", dst, func(o *Options) { o.withoutSegments = true })
	addPeer(t, a, "b", b)

	id, err := a.Write("b", seq(0, rows), seq(0, rows))
	require.NoError(t, err)
	got := nextCompletion(t, a, waitLimit)
	require.Equal(t, id, got.ID)
	require.NoError(t, got.Err)
	require.True(t, bytes.Equal(src.Mem[:rows*rowLen], dst.Mem[:rows*rowLen]))

	id, err = a.Write("b", seq(rows, rows), seq(rows, rows))
	require.NoError(t, err)
	a.Cancel("b", id)
	got = nextCompletion(t, a, waitLimit)
	require.Equal(t, id, got.ID)
	require.True(t, got.Err == nil || errors.Is(got.Err, data.ErrCanceled), "%v", got.Err)
	select {
	case extra := <-a.Completions():
		t.Fatalf("a second completion: %+v", extra)
	case <-time.After(100 * time.Millisecond):
	}
	a.mu.Lock()
	for _, l := range a.links {
		l.mu.Lock()
		assert.Empty(t, l.queue)
		l.mu.Unlock()
	}
	a.mu.Unlock()
}

package hostile

import (
	"encoding/binary"
	"runtime"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// str8 is a msgpack str of up to 255 bytes.
func str8(s string) []byte { return append([]byte{0xd9, byte(len(s))}, s...) }

// bigLookup is a lookup whose one key is a bin32 of n bytes: well-formed,
// just enormous.
func bigLookup(n int) []byte {
	b := make([]byte, 0, n+128)
	b = append(b, 0x84)
	b = append(b, str8("type")...)
	b = append(b, str8("lookup")...)
	b = append(b, str8("kv_request_id")...)
	b = append(b, str8("big")...)
	b = append(b, str8("keys")...)
	b = append(b, 0x91, 0xc6)
	b = binary.BigEndian.AppendUint32(b, uint32(n))
	b = b[:len(b)+n]
	b = append(b, str8("round_seq")...)
	return append(b, 0x00)
}

// Case 3. A node with max_frame_bytes 1 MiB is sent a 128 MiB frame after a
// correct handshake: it must not take the frame into its Go heap, and it
// keeps serving. Not parallel: it measures the process's allocations.
func TestOversizedFrameIsNotBuffered(t *testing.T) {
	T := OpenNode(t, map[string]any{"max_frame_bytes": 1 << 20})
	D := OpenNode(t, nil)
	a := NewAttacker(t, "127.0.0.1")
	c := a.Dial(T.ID(), a.ID, "")
	c.Handshake(3 * time.Second)

	frame := bigLookup(128 << 20)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	st0 := T.Stats()
	c.SendRaw(frame) // libzmq copies it; our buffer is ours alone
	frame = nil
	_ = frame
	// Wait until the node has dealt with it: the frame rejected, the
	// attacker's session dropped, or libzmq cut the connection (then
	// nothing shows but time).
	deadline := time.Now().Add(4 * time.Second)
	for time.Now().Before(deadline) {
		st := T.Stats()
		if st.BadFrames > st0.BadFrames || st.DroppedFrames > st0.DroppedFrames || st.Sessions < st0.Sessions {
			break
		}
		a.Pump(20 * time.Millisecond)
	}
	time.Sleep(200 * time.Millisecond)
	runtime.GC()
	runtime.ReadMemStats(&after)
	allocated := int64(after.TotalAlloc - before.TotalAlloc)
	grown := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("while the node handled a 128 MiB frame: %d MiB allocated, heap after GC %+d MiB; stats %+v",
		allocated>>20, grown>>20, T.Stats())
	assert.Less(t, allocated, int64(64<<20),
		"the node allocated %d MiB for a frame over its 1 MiB max_frame_bytes (it buffered the frame)", allocated>>20)
	assert.Less(t, grown, int64(64<<20), "the heap grew by %d MiB after GC", grown>>20)
	Pull(t, T, D)
}

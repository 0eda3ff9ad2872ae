package protocol

import (
	"bytes"
	"testing"
)

// benchFetch is a fetch of 64 keys of 36 bytes (one sha256 hash plus group
// index each), the size of a typical PD load of a 1k-token prompt.
func benchFetch() *Fetch {
	f := &Fetch{KVRequestID: "cmpl-0123456789abcdef-0", Keys: make([][]byte, 64), BlockIndexes: make([]uint64, 64), RoundSeq: 3}
	for i := range f.Keys {
		f.Keys[i] = bytes.Repeat([]byte{byte(i)}, 36)
		f.BlockIndexes[i] = uint64(1000 + i)
	}
	return f
}

func BenchmarkEncodeFetch(b *testing.B) {
	f := benchFetch()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Encode(f); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeFetch(b *testing.B) {
	frame, err := Encode(benchFetch())
	if err != nil {
		b.Fatal(err)
	}
	lim := Limits{KeyLen: 36}
	b.SetBytes(int64(len(frame)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(frame, lim); err != nil {
			b.Fatal(err)
		}
	}
}

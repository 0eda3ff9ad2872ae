package faults

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
)

// KeyLen is the length of every offload key in the suite (option key_len).
const KeyLen = 36

// Sentinel fills consumer rows before a load, so a write that should never
// have landed shows.
const Sentinel byte = 0xAB

// Key derives a key from a name.
func Key(name string) []byte {
	sum := sha256.Sum256([]byte(name))
	return append(sum[:], 0x70, 0x6b, 0x76, 0x00)
}

// word is the pattern's 8 bytes at offset off of a row holding key.
func word(key []byte, off int) uint64 {
	a := binary.LittleEndian.Uint64(key[0:8])
	b := binary.LittleEndian.Uint64(key[8:16])
	return a ^ (uint64(off)*0x9e3779b97f4a7c15 + b)
}

// Fill writes key's pattern into row (len a multiple of 8).
func Fill(row, key []byte) {
	for off := 0; off+8 <= len(row); off += 8 {
		binary.LittleEndian.PutUint64(row[off:], word(key, off))
	}
}

// Check returns the offset of the first byte of row that is not key's
// pattern, or -1 when the row is right.
func Check(row, key []byte) int {
	for off := 0; off+8 <= len(row); off += 8 {
		if binary.LittleEndian.Uint64(row[off:]) != word(key, off) {
			return off
		}
	}
	return -1
}

// Poison fills row with Sentinel.
func Poison(row []byte) {
	for i := range row {
		row[i] = Sentinel
	}
}

// Poisoned reports whether row still holds only Sentinel.
func Poisoned(row []byte) bool {
	return len(bytes.Trim(row, string([]byte{Sentinel}))) == 0
}

package protocol

import "fmt"

// knownTypes are the types Decode can decode.
var knownTypes = map[string]Type{}

func init() {
	for _, t := range []Type{TypeConnect, TypeConnectAck, TypeDisconnect, TypeLookup, TypeLookupResp, TypeFetch,
		TypeTransferDone, TypeAbortFetch, TypeAbortAck, TypeProof, TypePaths} {
		knownTypes[string(t)] = t
	}
}

// PeekType returns a frame's "type" without decoding the message: it walks
// the top-level map's keys up to the first "type", skipping the values of
// the others without allocating. peerkv and msgspec both write "type"
// first, so a frame from a real peer costs a few bytes whatever its size.
// A receiver uses it to decide whether the sender may send such a message
// at all before it pays for Decode, which still validates everything
// (PeekType does not: a frame it accepts may fail Decode).
//
// Errors wrap ErrMalformed (ErrTooLarge for a frame over the limit), or
// ErrUnknownType for a type Decode does not know.
func PeekType(frame []byte, lim Limits) (Type, error) {
	lim = lim.withDefaults()
	if len(frame) > lim.MaxFrameBytes {
		return "", fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(frame), lim.MaxFrameBytes)
	}
	r := reader{b: frame}
	top, err := r.next()
	if err != nil {
		return "", malformed("message: %v", err)
	}
	if top.Kind != kindMap {
		return "", malformed("message: expected map, got %s", top.describe())
	}
	for range top.Len {
		k, err := r.next()
		if err != nil {
			return "", malformed("message: %v", err)
		}
		if k.Kind == kindMap || k.Kind == kindArray {
			return "", malformed("message: key: %s cannot be a map key", k.describe())
		}
		v, err := r.next()
		if err != nil {
			return "", malformed("message: %v", err)
		}
		if k.Kind == kindStr && string(k.Bytes) == "type" {
			if v.Kind != kindStr {
				return "", malformed("message: type: expected str, got %s", v.describe())
			}
			t, known := knownTypes[string(v.Bytes)]
			if !known {
				return "", fmt.Errorf("%w: %s", ErrUnknownType, describeType(Type(v.Bytes)))
			}
			return t, nil
		}
		if err := r.skip(v, 1); err != nil {
			return "", malformed("message: %v", err)
		}
	}
	return "", malformed("message: type: missing")
}

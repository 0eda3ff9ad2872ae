package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/ugorji/go/codec"
)

// Sentinel errors. Every Decode failure wraps exactly one of ErrMalformed
// or ErrUnknownType; ErrTooLarge additionally wraps ErrMalformed.
var (
	// ErrMalformed marks a frame that violates the wire format. vLLM treats
	// this as a protocol error and disconnects the session.
	ErrMalformed = errors.New("malformed message")
	// ErrUnknownType marks a well-formed map whose "type" peerkv does not
	// know; like vLLM, the session logs it and carries on.
	ErrUnknownType = errors.New("unknown message type")
	// ErrTooLarge marks a frame over Limits.MaxFrameBytes.
	ErrTooLarge = fmt.Errorf("%w: frame too large", ErrMalformed)
)

// Defaults applied by Decode when a Limits field is zero.
const (
	DefaultMaxFrameBytes = 64 << 20
	DefaultMaxListItems  = 1 << 20
)

// msgpackHandle produces the same bytes as msgspec.msgpack.encode: smallest
// unsigned ints, str8, and []byte as bin (WriteExt). A configured handle is
// safe for concurrent use; encoders are not, hence the pool.
var msgpackHandle = &codec.MsgpackHandle{WriteExt: true, PositiveIntUnsigned: true}

var encoderPool = sync.Pool{New: func() any { return codec.NewEncoderBytes(nil, msgpackHandle) }}

// Wire forms: one struct per message, "type" first and the fields in
// vLLM's insertion order, so ugorji writes msgspec's exact bytes. Every
// slice is made non-nil before encoding (nil would be msgpack nil, which
// vLLM rejects).
type (
	wireConnect struct {
		Type              Type          `codec:"type"`
		PeerID            string        `codec:"peer_id"`
		AgentMetadata     []byte        `codec:"agent_metadata"`
		BaseAddr          uint64        `codec:"base_addr"`
		NumBlocks         uint64        `codec:"num_blocks"`
		BlockLen          uint64        `codec:"block_len"`
		ConfigFingerprint string        `codec:"config_fingerprint"`
		HashSeed          string        `codec:"hash_seed"`
		PeerKV            *Capabilities `codec:"peerkv,omitempty"`
	}
	wirePeerID struct {
		Type   Type   `codec:"type"`
		PeerID string `codec:"peer_id"`
	}
	wireTypeOnly struct {
		Type Type `codec:"type"`
	}
	wireDisconnect struct {
		Type   Type         `codec:"type"`
		PeerKV *wireRefusal `codec:"peerkv"`
	}
	wireRefusal struct {
		Refused string `codec:"refused"`
	}
	wireLookup struct {
		Type        Type     `codec:"type"`
		KVRequestID string   `codec:"kv_request_id"`
		Keys        [][]byte `codec:"keys"`
		RoundSeq    uint64   `codec:"round_seq"`
	}
	wireLookupResp struct {
		Type        Type     `codec:"type"`
		KVRequestID string   `codec:"kv_request_id"`
		Keys        [][]byte `codec:"keys"`
		Hits        []bool   `codec:"hits"`
	}
	wireFetch struct {
		Type         Type     `codec:"type"`
		KVRequestID  string   `codec:"kv_request_id"`
		Keys         [][]byte `codec:"keys"`
		BlockIndexes []uint64 `codec:"block_indexes"`
		RoundSeq     uint64   `codec:"round_seq"`
	}
	wireTransferDone struct {
		Type        Type         `codec:"type"`
		KVRequestID string       `codec:"kv_request_id"`
		Success     bool         `codec:"success"`
		RoundSeq    uint64       `codec:"round_seq"`
		PeerKV      *wireRowSums `codec:"peerkv,omitempty"`
	}
	// wireRowSums packs the row checksums as 8 big-endian bytes each.
	wireRowSums struct {
		XXH3 []byte `codec:"xxh3"`
	}
	wireProof struct {
		Type   Type   `codec:"type"`
		PeerID string `codec:"peer_id"`
		Proof  []byte `codec:"proof"`
	}
	wirePaths struct {
		Type          Type   `codec:"type"`
		AgentMetadata []byte `codec:"agent_metadata"`
		BaseAddr      uint64 `codec:"base_addr"`
		NumBlocks     uint64 `codec:"num_blocks"`
		DataTransport string `codec:"data_transport"`
		DataAddr      string `codec:"data_addr"`
		SameHost      string `codec:"same_host"`
		DataToken     string `codec:"data_token"`
		MAC           []byte `codec:"mac"`
	}
	wireRound struct {
		Type        Type   `codec:"type"`
		KVRequestID string `codec:"kv_request_id"`
		RoundSeq    uint64 `codec:"round_seq"`
	}
)

// Encoded is a message encoded ahead of its send (by Encode, off a lock
// its sender holds when it sends); Encode returns Frame as it is.
type Encoded struct {
	Message
	Frame []byte
}

// Encode returns m as one msgpack map, byte-identical to what vLLM's
// msgspec produces for the same dict. It refuses messages that a vLLM peer
// would reject as a protocol error (and disconnect for): unequal parallel
// lists, zero num_blocks or block_len.
func Encode(m Message) ([]byte, error) {
	if e, ok := m.(*Encoded); ok {
		return e.Frame, nil
	}
	wire, size, err := toWire(m)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, size)
	enc := encoderPool.Get().(*codec.Encoder)
	enc.ResetBytes(&out)
	err = enc.Encode(wire)
	enc.ResetBytes(nil) // drop the reference to out before pooling
	encoderPool.Put(enc)
	if err != nil {
		return nil, fmt.Errorf("encode %T: %w", m, err)
	}
	return out, nil
}

// toWire maps m to its wire struct and estimates the encoded size.
func toWire(m Message) (wire any, size int, err error) {
	const header = 64 // map header, type and field names of the small messages
	switch v := m.(type) {
	case *Connect:
		if v == nil {
			break
		}
		if v.NumBlocks == 0 || v.BlockLen == 0 {
			return nil, 0, fmt.Errorf("encode connect: num_blocks and block_len must be positive, got %d and %d", v.NumBlocks, v.BlockLen)
		}
		w := &wireConnect{TypeConnect, v.PeerID, nonNilBytes(v.AgentMetadata), v.BaseAddr, v.NumBlocks, v.BlockLen,
			v.ConfigFingerprint, v.HashSeed, nil}
		size = 2*header + len(v.PeerID) + len(v.AgentMetadata) + len(v.ConfigFingerprint) + len(v.HashSeed)
		if v.PeerKV != nil {
			c := *v.PeerKV
			c.Nonce = nonNilBytes(c.Nonce)
			w.PeerKV = &c
			size += 2*header + len(c.DataTransport) + len(c.DataAddr) + len(c.Nonce) + len(c.SameHost) + len(c.DataToken)
		}
		return w, size, nil
	case *ConnectAck:
		if v != nil {
			return &wirePeerID{TypeConnectAck, v.PeerID}, header + len(v.PeerID), nil
		}
	case *Disconnect:
		if v == nil {
			break
		}
		if len(v.Refused) == 0 {
			return &wireTypeOnly{TypeDisconnect}, header, nil
		}
		if len(v.Refused) > MaxRefused {
			return nil, 0, fmt.Errorf("encode disconnect: %d refused fields, limit %d", len(v.Refused), MaxRefused)
		}
		refused := strings.Join(v.Refused, ",")
		return &wireDisconnect{TypeDisconnect, &wireRefusal{refused}}, 2*header + len(refused), nil
	case *Lookup:
		if v != nil {
			keys, n := nonNilKeys(v.Keys)
			return &wireLookup{TypeLookup, v.KVRequestID, keys, v.RoundSeq}, header + len(v.KVRequestID) + n, nil
		}
	case *LookupResp:
		if v == nil {
			break
		}
		if len(v.Keys) != len(v.Hits) {
			return nil, 0, fmt.Errorf("encode lookup_resp: keys/hits length mismatch: %d vs %d", len(v.Keys), len(v.Hits))
		}
		keys, n := nonNilKeys(v.Keys)
		hits := v.Hits
		if hits == nil {
			hits = []bool{}
		}
		return &wireLookupResp{TypeLookupResp, v.KVRequestID, keys, hits}, header + len(v.KVRequestID) + n + len(hits), nil
	case *Fetch:
		if v == nil {
			break
		}
		if len(v.Keys) != len(v.BlockIndexes) {
			return nil, 0, fmt.Errorf("encode fetch: keys/block_indexes length mismatch: %d vs %d", len(v.Keys), len(v.BlockIndexes))
		}
		keys, n := nonNilKeys(v.Keys)
		idx := v.BlockIndexes
		if idx == nil {
			idx = []uint64{}
		}
		return &wireFetch{TypeFetch, v.KVRequestID, keys, idx, v.RoundSeq}, header + len(v.KVRequestID) + n + 9*len(idx), nil
	case *TransferDone:
		if v == nil {
			break
		}
		w := &wireTransferDone{TypeTransferDone, v.KVRequestID, v.Success, v.RoundSeq, nil}
		if v.RowSums != nil {
			packed := make([]byte, rowSumLen*len(v.RowSums))
			for i, sum := range v.RowSums {
				binary.BigEndian.PutUint64(packed[rowSumLen*i:], sum)
			}
			w.PeerKV = &wireRowSums{packed}
		}
		return w, 2*header + len(v.KVRequestID) + rowSumLen*len(v.RowSums), nil
	case *AbortFetch:
		if v != nil {
			return &wireRound{TypeAbortFetch, v.KVRequestID, v.RoundSeq}, header + len(v.KVRequestID), nil
		}
	case *AbortAck:
		if v != nil {
			return &wireRound{TypeAbortAck, v.KVRequestID, v.RoundSeq}, header + len(v.KVRequestID), nil
		}
	case *Proof:
		if v != nil {
			return &wireProof{TypeProof, v.PeerID, nonNilBytes(v.Proof)}, header + len(v.PeerID) + len(v.Proof), nil
		}
	case *Paths:
		if v == nil {
			break
		}
		if v.NumBlocks == 0 {
			return nil, 0, errors.New("encode peerkv_paths: num_blocks must be positive")
		}
		return &wirePaths{TypePaths, nonNilBytes(v.AgentMetadata), v.BaseAddr, v.NumBlocks, v.DataTransport, v.DataAddr,
				v.SameHost, v.DataToken, nonNilBytes(v.MAC)},
			2*header + len(v.AgentMetadata) + len(v.DataTransport) + len(v.DataAddr) + len(v.SameHost) + len(v.DataToken) + len(v.MAC), nil
	default:
		return nil, 0, fmt.Errorf("encode: unsupported message %T", m)
	}
	return nil, 0, fmt.Errorf("encode: nil %T", m)
}

func nonNilBytes(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}

// nonNilKeys returns keys with no nil slice (copying only if needed) and
// their encoded size estimate.
func nonNilKeys(keys [][]byte) ([][]byte, int) {
	if keys == nil {
		return [][]byte{}, 0
	}
	size, copied := 0, false
	for i, k := range keys {
		size += len(k) + 5 // bin32 header at most
		if k == nil {
			if !copied {
				keys = append([][]byte(nil), keys...)
				copied = true
			}
			keys[i] = []byte{}
		}
	}
	return keys, size
}

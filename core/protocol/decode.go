package protocol

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
)

// field enumerates every key peerkv reads. Values of other keys are skipped
// (vLLM ignores unknown keys too).
type field uint8

const (
	fType field = iota
	fPeerID
	fAgentMetadata
	fBaseAddr
	fNumBlocks
	fBlockLen
	fConfigFingerprint
	fHashSeed
	fPeerKV
	fKVRequestID
	fKeys
	fHits
	fBlockIndexes
	fRoundSeq
	fSuccess
	fProof
	fDataTransport
	fDataAddr
	fSameHost
	fDataToken
	fMAC
	numFields
)

var fieldNames = [numFields]string{
	fType: "type", fPeerID: "peer_id", fAgentMetadata: "agent_metadata", fBaseAddr: "base_addr",
	fNumBlocks: "num_blocks", fBlockLen: "block_len", fConfigFingerprint: "config_fingerprint",
	fHashSeed: "hash_seed", fPeerKV: CapabilitiesKey, fKVRequestID: "kv_request_id", fKeys: "keys",
	fHits: "hits", fBlockIndexes: "block_indexes", fRoundSeq: "round_seq", fSuccess: "success",
	fProof: "proof", fDataTransport: "data_transport", fDataAddr: "data_addr", fSameHost: "same_host", fDataToken: "data_token", fMAC: "mac",
}

func (f field) String() string { return fieldNames[f] }

// lookupField maps a key to its field; ok is false for keys peerkv ignores.
// The switch on string(b) does not allocate.
func lookupField(b []byte) (field, bool) {
	switch string(b) {
	case "type":
		return fType, true
	case "peer_id":
		return fPeerID, true
	case "agent_metadata":
		return fAgentMetadata, true
	case "base_addr":
		return fBaseAddr, true
	case "num_blocks":
		return fNumBlocks, true
	case "block_len":
		return fBlockLen, true
	case "config_fingerprint":
		return fConfigFingerprint, true
	case "hash_seed":
		return fHashSeed, true
	case CapabilitiesKey:
		return fPeerKV, true
	case "kv_request_id":
		return fKVRequestID, true
	case "keys":
		return fKeys, true
	case "hits":
		return fHits, true
	case "block_indexes":
		return fBlockIndexes, true
	case "round_seq":
		return fRoundSeq, true
	case "success":
		return fSuccess, true
	case "proof":
		return fProof, true
	case "data_transport":
		return fDataTransport, true
	case "data_addr":
		return fDataAddr, true
	case "same_host":
		return fSameHost, true
	case "data_token":
		return fDataToken, true
	case "mac":
		return fMAC, true
	}
	return 0, false
}

// parsed is a scanned message: where each known key's value starts.
type parsed struct {
	r      reader
	at     [numFields]int // offset of the value + 1; 0 = absent
	msg    Type           // for error messages
	limits Limits
}

// Decode parses and validates one frame. Errors wrap ErrUnknownType for a
// well-formed message of a type peerkv does not know, and ErrMalformed (with
// the field and the problem in the message) for everything else. The result
// never aliases frame.
func Decode(frame []byte, lim Limits) (Message, error) {
	lim = lim.withDefaults()
	if len(frame) > lim.MaxFrameBytes {
		return nil, fmt.Errorf("%w: %d bytes, limit %d", ErrTooLarge, len(frame), lim.MaxFrameBytes)
	}
	f, err := scan(frame, lim)
	if err != nil {
		return nil, err
	}
	return f.message()
}

func (l Limits) withDefaults() Limits {
	if l.MaxFrameBytes <= 0 {
		l.MaxFrameBytes = DefaultMaxFrameBytes
	}
	if l.MaxListItems <= 0 {
		l.MaxListItems = DefaultMaxListItems
	}
	return l
}

func malformed(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrMalformed}, args...)...)
}

// scan walks the top-level map once, recording known keys and skipping the
// rest, and requires the map to be the whole frame (as msgspec does).
func scan(b []byte, lim Limits) (*parsed, error) {
	f := &parsed{r: reader{b: b}, limits: lim}
	top, err := f.r.next()
	if err != nil {
		return nil, malformed("message: %v", err)
	}
	if top.Kind != kindMap {
		return nil, malformed("message: expected map, got %s", top.describe())
	}
	for range top.Len {
		k, err := f.r.next()
		if err != nil {
			return nil, malformed("message: %v", err)
		}
		id, known := field(0), false
		switch k.Kind {
		case kindStr:
			id, known = lookupField(k.Bytes)
		case kindMap, kindArray:
			// msgspec (vLLM's decoder) refuses a map as a key and turns an
			// array into a tuple; other decoders cannot hash either. No peer
			// sends one: refuse both rather than guess.
			return nil, malformed("message: key: %s cannot be a map key", k.describe())
		}
		if known {
			if f.at[id] != 0 {
				return nil, malformed("%s: duplicate key", id)
			}
			f.at[id] = f.r.off + 1
		} else if err := f.r.skip(k, 1); err != nil {
			return nil, malformed("message: key: %v", err)
		}
		v, err := f.r.next()
		if err == nil {
			err = f.r.skip(v, 1)
		}
		if err != nil {
			name := "message"
			if known {
				name = id.String()
			}
			return nil, malformed("%s: %v", name, err)
		}
	}
	if f.r.off != len(b) {
		return nil, malformed("message: %d trailing bytes after the map", len(b)-f.r.off)
	}
	return f, nil
}

// errMissing is returned by value for an absent key.
var errMissing = errors.New("missing")

// value returns the header token of a known key's value and positions the
// reader right after it.
func (f *parsed) value(id field) (token, error) {
	if f.at[id] == 0 {
		return token{}, errMissing
	}
	f.r.off = f.at[id] - 1
	return f.r.next() // cannot fail: scan already read it
}

// fail reports a problem with field id: "<type>: <field>: <problem>".
func (f *parsed) fail(id field, format string, args ...any) error {
	return f.failPath(id.String(), format, args...)
}

// failAt reports a problem with one list element: "<type>: <field>[i]: ...".
func (f *parsed) failAt(id field, index int, format string, args ...any) error {
	return f.failPath(fmt.Sprintf("%s[%d]", id, index), format, args...)
}

func (f *parsed) failPath(path, format string, args ...any) error {
	return fmt.Errorf("%w: %s: %s: %s", ErrMalformed, f.msg, path, fmt.Sprintf(format, args...))
}

func (f *parsed) message() (Message, error) {
	t, err := f.value(fType)
	if err == errMissing {
		return nil, malformed("message: type: missing")
	}
	if t.Kind != kindStr {
		return nil, malformed("message: type: expected str, got %s", t.describe())
	}
	f.msg = Type(t.Bytes)
	switch f.msg {
	case TypeConnect:
		return f.connect()
	case TypeConnectAck:
		id, err := f.str(fPeerID)
		if err != nil {
			return nil, err
		}
		return &ConnectAck{PeerID: id}, nil
	case TypeDisconnect:
		return f.disconnect()
	case TypeLookup:
		return f.lookup()
	case TypeLookupResp:
		return f.lookupResp()
	case TypeFetch:
		return f.fetch()
	case TypeTransferDone:
		return f.transferDone()
	case TypeAbortFetch, TypeAbortAck:
		id, err := f.str(fKVRequestID)
		if err != nil {
			return nil, err
		}
		round, err := f.uint(fRoundSeq, 0)
		if err != nil {
			return nil, err
		}
		if f.msg == TypeAbortFetch {
			return &AbortFetch{KVRequestID: id, RoundSeq: round}, nil
		}
		return &AbortAck{KVRequestID: id, RoundSeq: round}, nil
	case TypeProof:
		return f.proof()
	case TypePaths:
		return f.paths()
	}
	return nil, fmt.Errorf("%w: %s", ErrUnknownType, describeType(f.msg))
}

func describeType(t Type) string {
	s := string(t)
	if len(s) > 64 {
		s = s[:64] + "..."
	}
	return fmt.Sprintf("%q", s)
}

// disconnect reads a peerkv peer's refused fields (names only); a stock
// vLLM disconnect has none.
func (f *parsed) disconnect() (Message, error) {
	d := &Disconnect{}
	t, err := f.value(fPeerKV)
	if err != nil {
		return d, nil
	}
	if t.Kind != kindMap {
		return nil, f.fail(fPeerKV, "expected map, got %s", t.describe())
	}
	for range t.Len {
		k, _ := f.r.next()
		v, _ := f.r.next()
		if k.Kind != kindStr || string(k.Bytes) != "refused" {
			_ = f.r.skip(k, 2) // scan already checked the nesting
			_ = f.r.skip(v, 2)
			continue
		}
		path := CapabilitiesKey + ".refused"
		if v.Kind != kindStr {
			return nil, f.failPath(path, "expected str, got %s", v.describe())
		}
		if err := checkWireString(v.Bytes); err != nil {
			return nil, f.failPath(path, "%v", err)
		}
		names := strings.Split(string(v.Bytes), ",")
		if len(names) > MaxRefused {
			return nil, f.failPath(path, "%d names, limit %d", len(names), MaxRefused)
		}
		for _, n := range names {
			if n == "" || len(n) > 32 {
				return nil, f.failPath(path, "a name of %d bytes (1..32)", len(n))
			}
		}
		d.Refused = names
	}
	return d, nil
}

func (f *parsed) connect() (Message, error) {
	var c Connect
	var err error
	if c.PeerID, err = f.str(fPeerID); err != nil {
		return nil, err
	}
	if c.AgentMetadata, err = f.bin(fAgentMetadata, MaxAgentMetadataBytes); err != nil {
		return nil, err
	}
	if c.BaseAddr, err = f.uint(fBaseAddr, 0); err != nil {
		return nil, err
	}
	if c.NumBlocks, err = f.uint(fNumBlocks, 1); err != nil {
		return nil, err
	}
	if c.BlockLen, err = f.uint(fBlockLen, 1); err != nil {
		return nil, err
	}
	// vLLM reads config_fingerprint with a default of "" and never checks
	// its type; peerkv accepts it absent but requires a str when present.
	if f.at[fConfigFingerprint] != 0 {
		if c.ConfigFingerprint, err = f.str(fConfigFingerprint); err != nil {
			return nil, err
		}
	}
	if c.HashSeed, err = f.str(fHashSeed); err != nil {
		return nil, err
	}
	if f.at[fPeerKV] != 0 {
		if c.PeerKV, err = f.capabilities(); err != nil {
			return nil, err
		}
	}
	return &c, nil
}

func (f *parsed) lookup() (Message, error) {
	var m Lookup
	var err error
	if m.KVRequestID, err = f.str(fKVRequestID); err != nil {
		return nil, err
	}
	if m.Keys, err = f.keys(); err != nil {
		return nil, err
	}
	if m.RoundSeq, err = f.uint(fRoundSeq, 0); err != nil {
		return nil, err
	}
	return &m, nil
}

func (f *parsed) lookupResp() (Message, error) {
	var m LookupResp
	var err error
	if m.KVRequestID, err = f.str(fKVRequestID); err != nil {
		return nil, err
	}
	if m.Keys, err = f.keys(); err != nil {
		return nil, err
	}
	if m.Hits, err = f.bools(fHits); err != nil {
		return nil, err
	}
	if len(m.Keys) != len(m.Hits) {
		return nil, malformed("%s: keys/hits length mismatch: %d vs %d", f.msg, len(m.Keys), len(m.Hits))
	}
	return &m, nil
}

func (f *parsed) fetch() (Message, error) {
	var m Fetch
	var err error
	if m.KVRequestID, err = f.str(fKVRequestID); err != nil {
		return nil, err
	}
	if m.RoundSeq, err = f.uint(fRoundSeq, 0); err != nil {
		return nil, err
	}
	if m.Keys, err = f.keys(); err != nil {
		return nil, err
	}
	if m.BlockIndexes, err = f.uints(fBlockIndexes); err != nil {
		return nil, err
	}
	if len(m.Keys) != len(m.BlockIndexes) {
		return nil, malformed("%s: keys/block_indexes length mismatch: %d vs %d", f.msg, len(m.Keys), len(m.BlockIndexes))
	}
	return &m, nil
}

func (f *parsed) transferDone() (Message, error) {
	var m TransferDone
	var err error
	if m.KVRequestID, err = f.str(fKVRequestID); err != nil {
		return nil, err
	}
	if m.Success, err = f.bool(fSuccess); err != nil {
		return nil, err
	}
	if m.RoundSeq, err = f.uint(fRoundSeq, 0); err != nil {
		return nil, err
	}
	if f.at[fPeerKV] != 0 {
		if m.RowSums, err = f.rowSums(); err != nil {
			return nil, err
		}
	}
	return &m, nil
}

// rowSumLen is the bytes of one row's sum on the wire (XXH3-64).
const rowSumLen = 8

// rowSums reads transfer_done's "peerkv" map: "xxh3", 8 bytes per row,
// at most MaxListItems rows. Other keys are ignored; absent reads as nil.
func (f *parsed) rowSums() ([]uint64, error) {
	t, _ := f.value(fPeerKV)
	if t.Kind != kindMap {
		return nil, f.fail(fPeerKV, "expected map, got %s", t.describe())
	}
	var sums []uint64
	for range t.Len {
		k, _ := f.r.next()
		v, _ := f.r.next()
		if k.Kind != kindStr || string(k.Bytes) != VerifyXXH3 {
			_ = f.r.skip(k, 2) // scan already checked the nesting
			_ = f.r.skip(v, 2)
			continue
		}
		path := CapabilitiesKey + "." + VerifyXXH3
		if sums != nil {
			return nil, f.failPath(path, "duplicate key")
		}
		if v.Kind != kindBin {
			return nil, f.failPath(path, "expected bin, got %s", v.describe())
		}
		if len(v.Bytes)%rowSumLen != 0 || len(v.Bytes)/rowSumLen > f.limits.MaxListItems {
			return nil, f.failPath(path, "%d bytes: not %d per row, or over %d rows", len(v.Bytes), rowSumLen, f.limits.MaxListItems)
		}
		sums = make([]uint64, len(v.Bytes)/rowSumLen)
		for i := range sums {
			sums[i] = binary.BigEndian.Uint64(v.Bytes[rowSumLen*i:])
		}
	}
	return sums, nil
}

func (f *parsed) proof() (Message, error) {
	var m Proof
	var err error
	if m.PeerID, err = f.str(fPeerID); err != nil {
		return nil, err
	}
	if m.Proof, err = f.bin(fProof, MaxDigestBytes); err != nil {
		return nil, err
	}
	return &m, nil
}

func (f *parsed) paths() (Message, error) {
	var m Paths
	var err error
	if m.AgentMetadata, err = f.bin(fAgentMetadata, MaxAgentMetadataBytes); err != nil {
		return nil, err
	}
	if m.BaseAddr, err = f.uint(fBaseAddr, 0); err != nil {
		return nil, err
	}
	if m.NumBlocks, err = f.uint(fNumBlocks, 1); err != nil {
		return nil, err
	}
	if m.DataTransport, err = f.str(fDataTransport); err != nil {
		return nil, err
	}
	if m.DataAddr, err = f.str(fDataAddr); err != nil {
		return nil, err
	}
	if m.SameHost, err = f.str(fSameHost); err != nil {
		return nil, err
	}
	if f.at[fDataToken] != 0 { // absent: the peer's TCP path grants nothing
		if m.DataToken, err = f.str(fDataToken); err != nil {
			return nil, err
		}
	}
	if m.MAC, err = f.bin(fMAC, MaxDigestBytes); err != nil {
		return nil, err
	}
	return &m, nil
}

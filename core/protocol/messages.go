// Package protocol is the P2P wire vocabulary shared with vLLM's built-in
// p2p tier: message types, field names, msgpack encoding and validation.
// Wire strings appear nowhere else in peerkv.
//
// Every message is one msgpack map with string keys, discriminated by the
// "type" key. Field order follows vLLM's insertion order so encodings are
// byte-identical to what msgspec produces for the same dict.
package protocol

// Type is the value of a message's "type" key.
type Type string

// Message types of vLLM's P2P tier (wire revision with round_seq, vLLM >= 0.27).
const (
	TypeConnect      Type = "connect"
	TypeConnectAck   Type = "connect_ack"
	TypeDisconnect   Type = "disconnect"
	TypeLookup       Type = "lookup"
	TypeLookupResp   Type = "lookup_resp"
	TypeFetch        Type = "fetch"
	TypeTransferDone Type = "transfer_done"
	TypeAbortFetch   Type = "abort_fetch"
	TypeAbortAck     Type = "abort_ack"
)

// peerkv's own handshake messages, sent only between peerkv peers that share
// an auth secret (stock vLLM peers cannot authenticate and are refused
// before either is sent). See docs/security.md.
const (
	// TypeProof answers the peer's connect with proof of the shared secret
	// over both identities and both sessions' nonces.
	TypeProof Type = "peerkv_proof"
	// TypePaths carries the data-path fields a connect would, sent only
	// once the peer's proof verified, and authenticated itself.
	TypePaths Type = "peerkv_paths"
)

// CapabilitiesKey is the extra connect key in which peerkv peers advertise
// what they offer beyond vLLM's wire. vLLM's ConnectMsg.validate reads only
// its own keys (checked against vLLM 0.33.0), so stock peers ignore it.
const CapabilitiesKey = "peerkv"

// Message is implemented by every wire message.
type Message interface {
	MsgType() Type
}

// Capabilities is what a peerkv peer adds to its connect.
type Capabilities struct {
	// Version is peerkv's capability revision (currently 2).
	Version uint64 `codec:"version"`
	// DataTransport names the data paths this peer serves, e.g. "shm+nixl+tcp"
	// ("" when they follow in peerkv_paths, after authentication).
	DataTransport string `codec:"data_transport"`
	// DataAddr is the host:port of the peer's TCP data listener ("" if none).
	DataAddr string `codec:"data_addr"`
	// Nonce is this session's fresh challenge: with a shared secret the peer's
	// peerkv_proof must cover it, so no proof works in another session.
	Nonce []byte `codec:"nonce"`
	// SameHost is the same-host path's grant for the receiving peer alone
	// (see data.Grants); absent without that path.
	SameHost string `codec:"same_host,omitempty"`
	// DataToken keys the MAC of the receiving peer's TCP data connections
	// to us (see data.Grants); absent without the TCP path.
	DataToken string `codec:"data_token,omitempty"`
	// Verify names the row checksum this peer computes and checks
	// (VerifyXXH3), or "" (absent) when it offers none. Only when both
	// connects offer the same one does transfer_done carry row checksums.
	Verify string `codec:"verify,omitempty"`
	// Epoch names this start of the sender (random, fixed for the life of
	// its node): a connect under an identity we hold a session with and a
	// different epoch is a restarted peer, whose old session ends at once.
	// Absent (0) from peers before it.
	Epoch uint64 `codec:"epoch,omitempty"`
	// Probe marks a handshake-only probe (`peerkv doctor`): it moves no
	// rows, so its block_len is not compared before our connect tells it
	// ours, and its outcome is logged at INFO, not counted as a rejection.
	// Absent (false) from every other connect; stock vLLM ignores the map.
	Probe bool `codec:"probe,omitempty"`
}

// VerifyXXH3 is the row checksum peerkv offers: XXH3-64 (seed 0) of each
// row. Releases before it offered "crc32c"; a peer naming another function
// gets no checks (docs/wire.md §7.2).
const VerifyXXH3 = "xxh3"

// Connect is the first message on a connection, sent by both sides.
type Connect struct {
	PeerID            string
	AgentMetadata     []byte
	BaseAddr          uint64
	NumBlocks         uint64
	BlockLen          uint64
	ConfigFingerprint string
	HashSeed          string
	// PeerKV is encoded under CapabilitiesKey only when non-nil.
	PeerKV *Capabilities
}

// ConnectAck acknowledges a peer's Connect; PeerID is the replier's own id.
type ConnectAck struct {
	PeerID string
}

// Disconnect announces that the sender is closing the session.
type Disconnect struct {
	// Refused names the fields of the receiver's connect that the sender
	// refused ("block_len", "fingerprint", "hash_seed"), never their
	// values; sent only to peerkv peers, under CapabilitiesKey.
	Refused []string
}

// MaxRefused bounds Disconnect.Refused (and each name to 32 bytes).
const MaxRefused = 8

// Lookup asks a producer which keys it holds (symmetric P2P).
type Lookup struct {
	KVRequestID string
	Keys        [][]byte
	RoundSeq    uint64
}

// LookupResp answers one Lookup; Hits is parallel to Keys.
type LookupResp struct {
	KVRequestID string
	Keys        [][]byte
	Hits        []bool
}

// Fetch asks a producer to write Keys into the consumer's rows
// BlockIndexes. Empty Keys is the terminal "request finished" fetch.
type Fetch struct {
	KVRequestID  string
	Keys         [][]byte
	BlockIndexes []uint64
	RoundSeq     uint64
}

// IsTerminal reports whether f is the terminal empty fetch.
func (f *Fetch) IsTerminal() bool { return len(f.Keys) == 0 }

// TransferDone reports the end of one fetch round.
type TransferDone struct {
	KVRequestID string
	Success     bool
	RoundSeq    uint64
	// RowSums, when non-nil, is the XXH3-64 of each row written, parallel
	// to the fetch's block_indexes; encoded under CapabilitiesKey, sent
	// only to a peer that negotiated Capabilities.Verify.
	RowSums []uint64
}

// AbortFetch cancels one fetch round.
type AbortFetch struct {
	KVRequestID string
	RoundSeq    uint64
}

// AbortAck confirms that nothing more will be written for a round.
type AbortAck struct {
	KVRequestID string
	RoundSeq    uint64
}

func (*Connect) MsgType() Type      { return TypeConnect }
func (*ConnectAck) MsgType() Type   { return TypeConnectAck }
func (*Disconnect) MsgType() Type   { return TypeDisconnect }
func (*Lookup) MsgType() Type       { return TypeLookup }
func (*LookupResp) MsgType() Type   { return TypeLookupResp }
func (*Fetch) MsgType() Type        { return TypeFetch }
func (*TransferDone) MsgType() Type { return TypeTransferDone }
func (*AbortFetch) MsgType() Type   { return TypeAbortFetch }
func (*AbortAck) MsgType() Type     { return TypeAbortAck }
func (*Proof) MsgType() Type        { return TypeProof }
func (*Paths) MsgType() Type        { return TypePaths }

// Proof is one side's answer to the other's connect when a secret is set.
type Proof struct {
	// PeerID is the sender's own id.
	PeerID string
	// Proof is HMAC-SHA256 over the sender's and receiver's ids and both
	// nonces (core/session computes and checks it).
	Proof []byte
}

// Paths is the data-path half of a connect, sent after authentication.
type Paths struct {
	AgentMetadata []byte
	BaseAddr      uint64
	NumBlocks     uint64
	DataTransport string
	DataAddr      string
	SameHost      string
	DataToken     string
	// MAC is HMAC-SHA256 over every field above, both ids and both nonces.
	MAC []byte
}

// Limits bound what Decode accepts from a peer.
type Limits struct {
	// MaxFrameBytes rejects larger frames before decoding (0 = 64 MiB).
	MaxFrameBytes int
	// MaxListItems bounds keys/hits/block_indexes lengths (0 = 1<<20).
	MaxListItems int
	// KeyLen, when > 0, is the exact length every key must have.
	KeyLen int
}

// Bounds on variable-size fields, far above any legitimate value, so an
// unauthenticated peer cannot make a session hold megabytes.
const (
	// MaxStringBytes bounds every string field (ids, seeds, addresses).
	MaxStringBytes = 1024
	// MaxAgentMetadataBytes bounds NIXL agent metadata (a few KiB in practice).
	MaxAgentMetadataBytes = 1 << 20
	// MaxDigestBytes bounds nonces, proofs and MACs (16 to 32 bytes).
	MaxDigestBytes = 64
)

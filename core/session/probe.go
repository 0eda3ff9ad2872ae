package session

import "time"

// PeerConnect is what a peer's connect said about it, kept as it arrived
// (before our checks), for a probe such as `peerkv doctor`.
type PeerConnect struct {
	At                time.Time `json:"-"` // when it arrived
	PeerID            string    `json:"peer_id"`
	BlockLen          uint64    `json:"block_len"`
	NumBlocks         uint64    `json:"num_blocks"`
	ConfigFingerprint string    `json:"config_fingerprint"`
	HashSeed          string    `json:"hash_seed"`
	PeerKV            bool      `json:"peerkv"`                   // it advertised peerkv capabilities
	CapsVersion       uint64    `json:"peerkv_version,omitempty"` // their revision (PeerKV only)
	DataTransport     string    `json:"data_transport,omitempty"` // the data paths it offered (PeerKV only)
	Challenges        bool      `json:"auth,omitempty"`           // it sent a challenge: it has an auth secret
}

// Seen is the peer's connect, if one arrived.
func (s *Session) Seen() (PeerConnect, bool) {
	if s.hs.seen == nil {
		return PeerConnect{}, false
	}
	return *s.hs.seen, true
}

// Refused names the fields of our connect the peer refused (a peerkv peer
// names them; a stock vLLM peer does not).
func (s *Session) Refused() []string { return s.ended.refused }

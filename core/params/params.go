// Package params parses the orchestrator's kv_transfer_params: which remote
// counterpart a request transfers with, and in which role.
//
// Keys name the remote counterpart ("the remote ___ I transfer with"):
//   - remote_decoder {kv_request_id}: this peer is a prefill producer.
//   - remote_prefiller {kv_request_id, remote_host, remote_port}: PD decoder.
//   - remote_kv_source {kv_request_id, remote_host, remote_port}: P2P consumer.
//
// The only legal combination is remote_decoder + remote_kv_source. vLLM's
// tier silently lets remote_prefiller win; peerkv rejects every forbidden
// combination and every malformed field with an error that names it.
package params

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"
)

// Wire keys of kv_transfer_params.
const (
	KeyRemoteDecoder   = "remote_decoder"
	KeyRemotePrefiller = "remote_prefiller"
	KeyRemoteKVSource  = "remote_kv_source"
	fieldKVRequestID   = "kv_request_id"
	fieldRemoteHost    = "remote_host"
	fieldRemotePort    = "remote_port"
)

// ErrForbidden marks a forbidden key combination.
var ErrForbidden = errors.New("forbidden kv_transfer_params combination")

// ErrMalformed marks a malformed field.
var ErrMalformed = errors.New("malformed kv_transfer_params")

// Source is a remote peer this request pulls from.
type Source struct {
	KVRequestID string
	Host        string
	Port        int
	// Probe is true for remote_kv_source (look up first, pull hits) and false
	// for remote_prefiller (PD: claim every key, fetch all).
	Probe bool
}

// PeerID is the identity to dial: "host:port".
func (s Source) PeerID() string { return net.JoinHostPort(s.Host, strconv.Itoa(s.Port)) }

// Dest marks a prefill producer: a remote decoder will fetch KVRequestID.
type Dest struct {
	KVRequestID string
}

// Params is the parsed form. Both nil: the request does not use peerkv.
type Params struct {
	Source *Source
	Dest   *Dest
}

// Parse parses kv_transfer_params given as JSON (null, {} and "" mean none).
// Keys other than the three above belong to other components and are ignored.
func Parse(raw []byte) (Params, error) {
	if len(strings.TrimSpace(string(raw))) == 0 {
		return Params{}, nil
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(raw, &top); err != nil {
		return Params{}, fmt.Errorf("%w: kv_transfer_params must be a JSON object: %v", ErrMalformed, err)
	}
	// Like vLLM (kv_params.get(key) is None), a key set to null is absent:
	// orchestrators that serialize optional fields as null are not refused.
	for k, v := range top {
		if isJSONNull(v) {
			delete(top, k)
		}
	}
	_, hasDec := top[KeyRemoteDecoder]
	_, hasPre := top[KeyRemotePrefiller]
	_, hasSrc := top[KeyRemoteKVSource]
	if hasPre && (hasDec || hasSrc) {
		present := []string{KeyRemotePrefiller}
		if hasDec {
			present = append(present, KeyRemoteDecoder)
		}
		if hasSrc {
			present = append(present, KeyRemoteKVSource)
		}
		sort.Strings(present)
		return Params{}, fmt.Errorf("%w: %s given together; the only allowed combination is remote_decoder + remote_kv_source",
			ErrForbidden, strings.Join(present, " + "))
	}
	var p Params
	if hasDec {
		fields, err := object(KeyRemoteDecoder, top[KeyRemoteDecoder])
		if err != nil {
			return Params{}, err
		}
		id, err := requestID(KeyRemoteDecoder, fields)
		if err != nil {
			return Params{}, err
		}
		p.Dest = &Dest{KVRequestID: id}
	}
	for _, k := range []string{KeyRemotePrefiller, KeyRemoteKVSource} {
		raw, ok := top[k]
		if !ok {
			continue
		}
		src, err := source(k, raw)
		if err != nil {
			return Params{}, err
		}
		p.Source = src
	}
	return p, nil
}

func object(key string, raw json.RawMessage) (map[string]json.RawMessage, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return nil, fmt.Errorf("%w: %s must be an object with kv_request_id", ErrMalformed, key)
	}
	return fields, nil
}

func requestID(key string, fields map[string]json.RawMessage) (string, error) {
	raw, ok := fields[fieldKVRequestID]
	if !ok {
		return "", fmt.Errorf("%w: %s.kv_request_id is missing", ErrMalformed, key)
	}
	id, ok := jsonString(raw)
	if !ok {
		return "", fmt.Errorf("%w: %s.kv_request_id must be a string, got %s", ErrMalformed, key, excerpt(raw))
	}
	if id == "" {
		return "", fmt.Errorf("%w: %s.kv_request_id is empty", ErrMalformed, key)
	}
	return id, nil
}

func source(key string, raw json.RawMessage) (*Source, error) {
	fields, err := object(key, raw)
	if err != nil {
		return nil, err
	}
	id, err := requestID(key, fields)
	if err != nil {
		return nil, err
	}
	hr, ok := fields[fieldRemoteHost]
	if !ok {
		return nil, fmt.Errorf("%w: %s.remote_host is missing", ErrMalformed, key)
	}
	host, ok := jsonString(hr)
	if !ok {
		return nil, fmt.Errorf("%w: %s.remote_host must be a string, got %s", ErrMalformed, key, excerpt(hr))
	}
	if strings.TrimSpace(host) == "" {
		return nil, fmt.Errorf("%w: %s.remote_host is empty", ErrMalformed, key)
	}
	pr, ok := fields[fieldRemotePort]
	if !ok {
		return nil, fmt.Errorf("%w: %s.remote_port is missing", ErrMalformed, key)
	}
	if t := strings.TrimSpace(string(pr)); t == "" || t[0] == '"' {
		return nil, fmt.Errorf("%w: %s.remote_port must be an integer in 1..65535, got %s", ErrMalformed, key, excerpt(pr))
	}
	var port json.Number
	dec := json.NewDecoder(strings.NewReader(string(pr)))
	dec.UseNumber()
	if err := dec.Decode(&port); err != nil {
		return nil, fmt.Errorf("%w: %s.remote_port must be an integer in 1..65535, got %s", ErrMalformed, key, excerpt(pr))
	}
	n, err := strconv.ParseInt(port.String(), 10, 64)
	if err != nil || n < 1 || n > 65535 {
		return nil, fmt.Errorf("%w: %s.remote_port must be an integer in 1..65535, got %s", ErrMalformed, key, excerpt(pr))
	}
	return &Source{KVRequestID: id, Host: host, Port: int(n), Probe: key == KeyRemoteKVSource}, nil
}

func isJSONNull(raw json.RawMessage) bool { return strings.TrimSpace(string(raw)) == "null" }

// jsonString decodes raw if it is a JSON string. json.Unmarshal alone would
// turn null into "" and report a null id as empty rather than not a string.
func jsonString(raw json.RawMessage) (string, bool) {
	var s string
	if isJSONNull(raw) || json.Unmarshal(raw, &s) != nil {
		return "", false
	}
	return s, true
}

// excerpt bounds how much of a caller's value an error message repeats.
func excerpt(raw json.RawMessage) string {
	const limit = 64
	if len(raw) > limit {
		return string(raw[:limit]) + "..."
	}
	return string(raw)
}

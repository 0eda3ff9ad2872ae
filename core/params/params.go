// Package params parses the orchestrator's kv_transfer_params: which remote
// counterpart a request transfers with, and in which role.
//
// Keys name the remote counterpart ("the remote ___ I transfer with"):
//   - remote_decoder {kv_request_id}: this node is a prefill producer.
//   - remote_prefiller {kv_request_id, endpoint}: PD decoder.
//   - remote_kv_source {kv_request_id?, endpoint}, or a list of them (and of
//     URL strings) in the orchestrator's order of preference: P2P consumer.
//     Without kv_request_id the consumer mints one per source.
//
// An endpoint is remote_host + remote_port, remote_url (url.go), or both
// when they agree. The only legal combination is remote_decoder +
// remote_kv_source. vLLM's tier silently lets remote_prefiller win; peerkv
// rejects every forbidden combination and every malformed field with an
// error that names it. docs/kv_transfer_params.schema.json is the same
// grammar for orchestrator authors (schema_test.go checks the two agree).
package params

import (
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sort"
	"strconv"
	"strings"

	"github.com/peerkv/peerkv/core/protocol"
)

// Wire keys of kv_transfer_params.
const (
	KeyRemoteDecoder   = "remote_decoder"
	KeyRemotePrefiller = "remote_prefiller"
	KeyRemoteKVSource  = "remote_kv_source"
	fieldKVRequestID   = "kv_request_id"
	fieldRemoteHost    = "remote_host"
	fieldRemotePort    = "remote_port"
	fieldRemoteURL     = "remote_url"
)

// MaxSources bounds the sources one request may list whatever the peer's
// max_sources_per_request says (the schema's maxItems).
const MaxSources = 16

// ErrForbidden marks a forbidden key combination.
var ErrForbidden = errors.New("forbidden kv_transfer_params combination")

// ErrMalformed marks a malformed field.
var ErrMalformed = errors.New("malformed kv_transfer_params")

// Source is a remote peer this request pulls from.
type Source struct {
	// KVRequestID is the orchestrator's id; "" for a remote_kv_source that
	// left it out (the consumer mints one).
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

// Params is the parsed form. No sources and no dest: the request does not
// use peerkv.
type Params struct {
	// Sources the request pulls from, in the orchestrator's order of
	// preference: one for remote_prefiller, 1..maxSources for
	// remote_kv_source.
	Sources []Source
	Dest    *Dest
}

// Parse parses kv_transfer_params given as JSON (null, {} and "" mean none);
// remote_kv_source may list at most maxSources sources (clamped to
// 1..MaxSources). Keys other than the three above belong to other
// components and are ignored.
func Parse(raw []byte, maxSources int) (Params, error) {
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
		id, err := requestID(KeyRemoteDecoder, fields, true)
		if err != nil {
			return Params{}, err
		}
		p.Dest = &Dest{KVRequestID: id}
	}
	var err error
	switch {
	case hasPre:
		p.Sources, err = prefiller(top[KeyRemotePrefiller])
	case hasSrc:
		p.Sources, err = kvSources(top[KeyRemoteKVSource], min(max(maxSources, 1), MaxSources))
	}
	if err != nil {
		return Params{}, err
	}
	return p, nil
}

func prefiller(raw json.RawMessage) ([]Source, error) {
	if strings.HasPrefix(strings.TrimSpace(string(raw)), "[") {
		return nil, fmt.Errorf("%w: remote_prefiller must be an object: a decode leg pulls from the one prefiller "+
			"that computed it (lists are for remote_kv_source)", ErrMalformed)
	}
	src, err := source(KeyRemotePrefiller, raw, false)
	if err != nil {
		return nil, err
	}
	return []Source{src}, nil
}

// kvSources parses remote_kv_source: one object, or a list of objects and
// URL strings in the orchestrator's order.
func kvSources(raw json.RawMessage, maxSources int) ([]Source, error) {
	var list []json.RawMessage
	if !strings.HasPrefix(strings.TrimSpace(string(raw)), "[") {
		src, err := source(KeyRemoteKVSource, raw, true)
		if err != nil {
			return nil, err
		}
		return []Source{src}, nil
	}
	if err := json.Unmarshal(raw, &list); err != nil {
		return nil, fmt.Errorf("%w: remote_kv_source must be an object or a list of sources: %v", ErrMalformed, err)
	}
	if len(list) == 0 {
		return nil, fmt.Errorf("%w: remote_kv_source is an empty list; give at least one source, or leave the key out", ErrMalformed)
	}
	if len(list) > maxSources {
		return nil, fmt.Errorf("%w: remote_kv_source lists %d sources; this node takes at most %d (option max_sources_per_request)",
			ErrMalformed, len(list), maxSources)
	}
	out := make([]Source, 0, len(list))
	seen := map[string]int{}
	for i, item := range list {
		name := fmt.Sprintf("%s[%d]", KeyRemoteKVSource, i)
		var src Source
		var err error
		if u, ok := jsonString(item); ok {
			src = Source{Probe: true}
			src.Host, src.Port, err = parseURL(u)
			if err != nil {
				err = fmt.Errorf("%w: %s: %v", ErrMalformed, name, err)
			}
		} else {
			src, err = source(name, item, true)
		}
		if err != nil {
			return nil, err
		}
		if first, dup := seen[src.PeerID()]; dup {
			return nil, fmt.Errorf("%w: %s names peer %s again (as %s[%d]); list each source once",
				ErrMalformed, name, src.PeerID(), KeyRemoteKVSource, first)
		}
		seen[src.PeerID()] = i
		out = append(out, src)
	}
	return out, nil
}

// source parses one source object; name locates it in errors.
func source(name string, raw json.RawMessage, probe bool) (Source, error) {
	fields, err := object(name, raw)
	if err != nil {
		return Source{}, err
	}
	id, err := requestID(name, fields, !probe)
	if err != nil {
		return Source{}, err
	}
	host, port, err := endpoint(name, fields)
	if err != nil {
		return Source{}, err
	}
	return Source{KVRequestID: id, Host: host, Port: port, Probe: probe}, nil
}

func object(name string, raw json.RawMessage) (map[string]json.RawMessage, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil || fields == nil {
		return nil, fmt.Errorf("%w: %s must be an object with kv_request_id, got %s", ErrMalformed, name, excerpt(raw))
	}
	return fields, nil
}

// requestID reads kv_request_id: required, or "" when absent and optional.
func requestID(name string, fields map[string]json.RawMessage, required bool) (string, error) {
	raw, ok := fields[fieldKVRequestID]
	if !ok {
		if !required {
			return "", nil
		}
		return "", fmt.Errorf("%w: %s.kv_request_id is missing", ErrMalformed, name)
	}
	id, ok := jsonString(raw)
	if !ok {
		return "", fmt.Errorf("%w: %s.kv_request_id must be a string, got %s", ErrMalformed, name, excerpt(raw))
	}
	if id == "" {
		return "", fmt.Errorf("%w: %s.kv_request_id is empty", ErrMalformed, name)
	}
	if err := protocol.CheckString(id); err != nil {
		return "", fmt.Errorf("%w: %s.kv_request_id cannot go on the wire: %v", ErrMalformed, name, err)
	}
	return id, nil
}

// endpoint reads remote_host + remote_port, remote_url, or both when they
// agree; the identity keeps remote_host's spelling (the field stock vLLM
// reads), else the URL's host without brackets.
func endpoint(name string, fields map[string]json.RawMessage) (string, int, error) {
	ur, hasURL := fields[fieldRemoteURL]
	_, hasHost := fields[fieldRemoteHost]
	_, hasPort := fields[fieldRemotePort]
	if !hasURL {
		return hostPort(name, fields)
	}
	u, ok := jsonString(ur)
	if !ok {
		return "", 0, fmt.Errorf("%w: %s.remote_url must be a string, got %s", ErrMalformed, name, excerpt(ur))
	}
	uh, up, err := parseURL(u)
	if err != nil {
		return "", 0, fmt.Errorf("%w: %s.remote_url: %v", ErrMalformed, name, err)
	}
	if !hasHost && !hasPort {
		return uh, up, nil
	}
	host, port, err := hostPort(name, fields)
	if err != nil {
		return "", 0, err
	}
	if port != up || !sameHost(host, uh) {
		return "", 0, fmt.Errorf("%w: %s: remote_host/remote_port %s and remote_url %s name different peers; give one, or both alike",
			ErrMalformed, name, net.JoinHostPort(cut(host), strconv.Itoa(port)), cut(u))
	}
	return host, port, nil
}

// sameHost: the same spelling, or the same IP address.
func sameHost(a, b string) bool {
	if a == b {
		return true
	}
	ia, ib := net.ParseIP(a), net.ParseIP(b)
	return ia != nil && ib != nil && ia.Equal(ib)
}

func hostPort(name string, fields map[string]json.RawMessage) (string, int, error) {
	hr, ok := fields[fieldRemoteHost]
	if !ok {
		return "", 0, fmt.Errorf("%w: %s.remote_host is missing (give remote_host and remote_port, or remote_url)", ErrMalformed, name)
	}
	host, ok := jsonString(hr)
	if !ok {
		return "", 0, fmt.Errorf("%w: %s.remote_host must be a string, got %s", ErrMalformed, name, excerpt(hr))
	}
	if strings.TrimSpace(host) == "" {
		return "", 0, fmt.Errorf("%w: %s.remote_host is empty", ErrMalformed, name)
	}
	if err := protocol.CheckString(host); err != nil {
		return "", 0, fmt.Errorf("%w: %s.remote_host: %v", ErrMalformed, name, err)
	}
	pr, ok := fields[fieldRemotePort]
	if !ok {
		return "", 0, fmt.Errorf("%w: %s.remote_port is missing", ErrMalformed, name)
	}
	bad := fmt.Errorf("%w: %s.remote_port must be an integer in 1..65535, got %s", ErrMalformed, name, excerpt(pr))
	if t := strings.TrimSpace(string(pr)); t == "" || t[0] == '"' {
		return "", 0, bad
	}
	var port json.Number
	dec := json.NewDecoder(strings.NewReader(string(pr)))
	dec.UseNumber()
	if err := dec.Decode(&port); err != nil {
		return "", 0, bad
	}
	n, err := strconv.ParseInt(port.String(), 10, 64)
	if err != nil || n < 1 || n > 65535 {
		return "", 0, bad
	}
	return host, int(n), nil
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

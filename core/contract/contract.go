// Package contract is what the Python package knows of the library without
// loading it: the options schema (core/config), the metric shapes and the
// stats JSON keys (core/tier), as one JSON document. vLLM's API-server process checks a
// tier configuration and declares metrics from it; loading the Go runtime
// there just for that would cost a runtime per API-server process, and the
// library may be absent from that host. So the document is generated into
// python/peerkv/_options_schema.py (a test fails when that file is stale)
// and its digest is also in peerkv_info, so `peerkv info` can tell whether
// a library and a package were built from the same schema.
package contract

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"reflect"
	"strings"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/tier"
)

// Document is the exported contract.
type Document struct {
	Version         int                  `json:"version"`
	Options         []Option             `json:"options"`
	MaxSeconds      int                  `json:"max_seconds"`
	Histograms      map[string][]float64 `json:"histograms"`
	RejectionCauses []string             `json:"rejection_causes"`
	// ConnectFailureCauses label peer_connect_failures.
	ConnectFailureCauses []string `json:"connect_failure_causes"`
	DataPaths            []string `json:"data_paths"`
	// StatsKeys are the JSON keys of peerkv_stats: "stats" the top level,
	// "paths" each data path's entry, "peers" each peer's entry, "link"
	// the link object in a peer's entry, "histogram" each histogram's
	// snapshot. The Python metric tables are checked against them both ways.
	StatsKeys map[string][]string `json:"stats_keys"`
}

// Option is a schema entry with the phrase its error messages use ("port
// must be <want>, got ..."), so both languages word them alike.
type Option struct {
	config.Option
	Want string `json:"want"`
}

// Version changes when the document's shape does.
const Version = 2

// Build assembles the document.
func Build() Document {
	opts := make([]Option, len(config.Options))
	for i, o := range config.Options {
		opts[i] = Option{Option: o, Want: o.Want()}
	}
	return Document{
		Version:    Version,
		Options:    opts,
		MaxSeconds: config.MaxSeconds,
		Histograms: map[string][]float64{
			"lookup_rtt_s":    tier.LookupRTTBuckets,
			"lookup_served_s": tier.LookupRTTBuckets,
			"load_s":          tier.LoadSecondsBuckets,
		},
		RejectionCauses:      tier.RejectionCauses,
		ConnectFailureCauses: tier.ConnectFailureCauses,
		DataPaths:            []string{"shm", "nixl", "tcp", tier.NoPath},
		StatsKeys: map[string][]string{
			"stats": jsonKeys(tier.Stats{}),
			"paths": jsonKeys(tier.PathStats{}),
			"peers": jsonKeys(tier.PeerStats{}),
			"link":  jsonKeys(tier.LinkStats{}),
			// Every histogram (lookup_rtt_s, load_s, a peer's lookup_rtt_s)
			// is replayed from these keys: a rename would drop them all.
			"histogram": jsonKeys(tier.Histogram{}),
		},
	}
}

// jsonKeys lists the JSON keys of a struct's fields, in field order
// (an embedded struct's inline, as encoding/json writes them).
func jsonKeys(v any) []string {
	return typeKeys(reflect.TypeOf(v))
}

func typeKeys(t reflect.Type) []string {
	var keys []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			keys = append(keys, typeKeys(f.Type)...)
			continue
		}
		if name != "" && name != "-" {
			keys = append(keys, name)
		}
	}
	return keys
}

// JSON is the document's canonical encoding (indented, stable order).
func JSON() []byte {
	b, err := json.MarshalIndent(Build(), "", " ")
	if err != nil {
		panic(err) // static data
	}
	return b
}

// Digest is the SHA-256 of JSON, hex.
func Digest() string {
	sum := sha256.Sum256(JSON())
	return hex.EncodeToString(sum[:])
}

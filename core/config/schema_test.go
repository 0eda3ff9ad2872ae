package config

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The schema and the JSON struct FromJSON decodes into must list the same
// keys with the same types: a key added to one only fails here.
func TestSchemaMatchesTheJSONStruct(t *testing.T) {
	goType := map[string]reflect.Type{
		TypeString:     reflect.TypeOf((*string)(nil)),
		TypeInteger:    reflect.TypeOf((*int)(nil)),
		TypeSeconds:    reflect.TypeOf((*float64)(nil)),
		TypeBoolean:    reflect.TypeOf((*bool)(nil)),
		TypeStringList: reflect.TypeOf([]string(nil)),
	}
	fields := map[string]reflect.Type{}
	st := reflect.TypeOf(jsonConfig{})
	for i := range st.NumField() {
		f := st.Field(i)
		fields[strings.Split(f.Tag.Get("json"), ",")[0]] = f.Type
	}
	seen := map[string]bool{}
	for _, o := range Options {
		assert.False(t, seen[o.Name], "%s is in the schema twice", o.Name)
		seen[o.Name] = true
		ft, ok := fields[o.Name]
		if assert.True(t, ok, "schema option %s has no jsonConfig field", o.Name) {
			assert.Equal(t, goType[o.Type], ft, "%s: schema type %s", o.Name, o.Type)
		}
		assert.NotEmpty(t, o.Doc, o.Name)
	}
	for name := range fields {
		assert.True(t, seen[name], "jsonConfig field %s is not in the schema (core/config/schema.go)", name)
	}
}

// A value of the wrong type is refused naming its key, for every key,
// before anything else runs.
func TestEveryTypeErrorNamesItsKey(t *testing.T) {
	wrong := map[string][]string{
		TypeString:     {`5`, `true`, `["a"]`, `{}`},
		TypeInteger:    {`"abc"`, `"5"`, `5.5`, `true`, `[1]`, `1e3`},
		TypeSeconds:    {`"30"`, `true`, `[1]`, `0`, `-1`, `86401`},
		TypeBoolean:    {`"true"`, `1`, `[]`},
		TypeStringList: {`"UCX"`, `[1]`, `{}`, `true`},
	}
	for _, o := range Options {
		for _, v := range wrong[o.Type] {
			_, err := FromJSON([]byte(`{"` + o.Name + `": ` + v + `}`))
			if assert.Error(t, err, "%s = %s", o.Name, v) {
				assert.True(t, strings.HasPrefix(err.Error(), "options: "+o.Name+" must be "+o.Want()),
					"%s = %s: %v", o.Name, v, err)
			}
		}
	}
	_, err := FromJSON([]byte(`{"port": "abc"}`))
	assert.EqualError(t, err, `options: port must be an integer in 1..65535, got "abc"`)
	_, err = FromJSON([]byte(`{"load_timeout_s": "5"}`))
	assert.EqualError(t, err, `options: load_timeout_s must be a positive number of seconds up to 86400, got "5"`)
}

func TestNullMeansNotGiven(t *testing.T) {
	c, err := FromJSON([]byte(`{"port": null, "host": null, "load_timeout_s": null}`))
	require.NoError(t, err)
	assert.Equal(t, "localhost:5710", c.LocalID())
}

func TestSecretValuesAreNeverEchoed(t *testing.T) {
	_, err := FromJSON([]byte(`{"auth_secret": 1234567}`))
	require.Error(t, err)
	assert.Equal(t, "options: auth_secret must be a string", err.Error())
}

func TestUnknownKeysSuggestTheClosestOne(t *testing.T) {
	for key, want := range map[string]string{
		"prot":                 `unknown option "prot" (did you mean "port"?)`,
		"load-timeout-s":       `unknown option "load-timeout-s" (did you mean "load_timeout_s"?)`,
		"Handshake_Timeout":    `unknown option "Handshake_Timeout" (did you mean "handshake_timeout_s"?)`,
		"auth_secret_fil":      `unknown option "auth_secret_fil" (did you mean "auth_secret_file"?)`,
		"advertised_host":      `unknown option "advertised_host" (did you mean "advertise_host"?)`,
		"gomaxprocs":           `unknown option "gomaxprocs" (did you mean "go_max_procs"?)`,
		"completely_different": `unknown option "completely_different" (the options are listed in docs/vllm.md)`,
	} {
		_, err := FromJSON([]byte(`{"` + key + `": 1}`))
		assert.EqualError(t, err, "options: "+want, key)
	}
}

func TestWildcardHostNeedsAnAdvertisedIdentity(t *testing.T) {
	for _, host := range []string{"0.0.0.0", "::", "[::]"} {
		_, err := FromJSON([]byte(`{"host": "` + host + `"}`))
		require.Error(t, err, host)
		assert.Contains(t, err.Error(), "set advertise_host to this node's routable address", host)
	}
	c, err := FromJSON([]byte(`{"host": "0.0.0.0", "advertise_host": "10.0.0.1", "port": 5711}`))
	require.NoError(t, err)
	assert.Equal(t, "10.0.0.1:5711", c.LocalID(), "peers dial the advertised host")
	assert.Equal(t, "0.0.0.0", c.Host, "the wildcard is still what binds")
	c, err = FromJSON([]byte(`{"host": "::", "advertise_host": "fd00::7"}`))
	require.NoError(t, err)
	assert.Equal(t, "[fd00::7]:5710", c.LocalID())
	c, err = FromJSON([]byte(`{"host": "10.0.0.2", "advertise_host": "node-2.cluster"}`))
	require.NoError(t, err)
	assert.Equal(t, "node-2.cluster:5710", c.LocalID(), "an advertised name may differ from the bound address")
	_, err = FromJSON([]byte(`{"host": "10.0.0.2", "advertise_host": "0.0.0.0"}`))
	assert.ErrorContains(t, err, `advertise_host "0.0.0.0" is a wildcard`)
}

func TestGoMaxProcsOption(t *testing.T) {
	c, err := FromJSON([]byte(`{"go_max_procs": 3}`))
	require.NoError(t, err)
	assert.Equal(t, 3, c.GoMaxProcs)
	c, err = FromJSON(nil)
	require.NoError(t, err)
	assert.Equal(t, 0, c.GoMaxProcs, "0: sized by the library")
	_, err = FromJSON([]byte(`{"go_max_procs": 0}`))
	assert.EqualError(t, err, "options: go_max_procs must be an integer in 1..1024, got 0")
}

func TestSuggestIsDeterministic(t *testing.T) {
	known := []string{"b_timeout_s", "a_timeout_s"}
	for range 20 {
		assert.Equal(t, "a_timeout_s", Suggest("c_timeout_s", known), "ties go to the first in sorted order")
	}
	assert.Equal(t, "", Suggest("x", nil))
}

// The defaults the schema documents (and Python's check-config and the docs
// print) are the defaults FromJSON applies: giving an option its documented
// default changes nothing. A constant changed on one side only fails here.
func TestDocumentedDefaultsAreTheAppliedOnes(t *testing.T) {
	// Defaults that are not a value of the option's type: computed at open,
	// or a reference to another option.
	notAValue := map[string]string{
		"advertise_host":     "follows host",
		"data_host":          "follows host",
		"data_port":          "follows port (port + 1000)",
		"allowed_peers":      "any peer: no list",
		"keep_warm":          "none: no list",
		"max_frame_bytes":    "derived from the region",
		"max_list_items":     "derived from the region",
		"go_max_procs":       "derived from the CPUs",
		"config_fingerprint": "derived from the engine",
		"hash_seed":          "derived from the engine",
		"key_len":            "derived from the engine",
	}
	base, err := FromJSON([]byte(`{}`))
	require.NoError(t, err)
	checked := 0
	for _, o := range Options {
		if _, ok := notAValue[o.Name]; ok {
			continue
		}
		var lit string
		switch o.Type {
		case TypeString:
			if o.Default == "" {
				continue // "": none, the option is unset
			}
			lit = strconv.Quote(o.Default)
		case TypeStringList:
			lit = o.Default // written as JSON
		default:
			lit = o.Default // integers, seconds and booleans are written as JSON literals
		}
		got, err := FromJSON([]byte(fmt.Sprintf(`{%q: %s}`, o.Name, lit)))
		if !assert.NoError(t, err, "%s: its documented default %q is not a value it accepts; if it is computed, list it in notAValue", o.Name, o.Default) {
			continue
		}
		assert.Equal(t, base, got, "%s: documented default %q differs from the default FromJSON applies", o.Name, o.Default)
		checked++
	}
	for name := range notAValue {
		assert.True(t, slices.ContainsFunc(Options, func(o Option) bool { return o.Name == name }), "notAValue names %s, which is no option", name)
	}
	assert.Greater(t, checked, 20, "most defaults are plain values")
}

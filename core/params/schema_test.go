package params

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The JSON Schema for orchestrator authors (docs/kv_transfer_params.schema.json)
// is checked against the parser: every case of this package's tables is
// validated by Python's jsonschema (Draft 2020-12) and must get the parser's
// verdict, except the refusals a schema cannot express, which name why
// (refusedCase.schemaAllows) and must be accepted by the schema.

const schemaPath = "../../docs/kv_transfer_params.schema.json"

const validateSchema = `
import json, sys
from jsonschema import Draft202012Validator
schema = json.load(open(sys.argv[1]))
Draft202012Validator.check_schema(schema)
validator = Draft202012Validator(schema)
print(json.dumps([validator.is_valid(json.loads(doc)) for doc in json.load(sys.stdin)]))
`

func TestSchemaAgreesWithTheParser(t *testing.T) {
	type check struct {
		name, raw    string
		maxSources   int
		parserOK     bool
		schemaAllows string
	}
	var checks []check
	for _, table := range []map[string]validCase{parseModes, sourceForms} {
		for name, c := range table {
			checks = append(checks, check{name: name, raw: c.raw, maxSources: MaxSources, parserOK: true})
		}
	}
	for _, table := range []struct {
		cases      map[string]refusedCase
		maxSources int
	}{{forbiddenCases, MaxSources}, {malformedCases, MaxSources}, {malformedSources, testMaxSources}} {
		for name, c := range table.cases {
			if !json.Valid([]byte(c.raw)) {
				continue // not JSON at all: no schema to ask
			}
			checks = append(checks, check{name: name, raw: c.raw, maxSources: table.maxSources, schemaAllows: c.schemaAllows})
		}
	}
	docs := make([]string, len(checks))
	for i, c := range checks {
		docs[i] = c.raw
	}
	verdicts := schemaVerdicts(t, docs)
	require.Len(t, verdicts, len(checks))
	allowed := 0
	for i, c := range checks {
		_, err := Parse([]byte(c.raw), c.maxSources)
		require.Equal(t, c.parserOK, err == nil, "%s: the tables say the parser %s it: %v", c.name, verdict(c.parserOK), err)
		if c.schemaAllows != "" {
			allowed++
			assert.True(t, verdicts[i], "%s: the schema refuses it although the table says it cannot (%s): drop schemaAllows", c.name, c.schemaAllows)
			continue
		}
		assert.Equal(t, c.parserOK, verdicts[i], "%s: the parser %s it, the schema %s it:\n%s",
			c.name, verdict(c.parserOK), verdict(verdicts[i]), c.raw)
	}
	assert.Less(t, allowed, len(checks)/5, "the schema should refuse nearly everything the parser does")
}

func verdict(ok bool) string {
	if ok {
		return "accepts"
	}
	return "refuses"
}

// schemaVerdicts validates each JSON document against the schema.
func schemaVerdicts(t *testing.T, docs []string) []bool {
	py := schemaPython(t)
	in, err := json.Marshal(docs)
	require.NoError(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-c", validateSchema, schemaPath)
	cmd.Stdin = strings.NewReader(string(in))
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	require.NoError(t, err, "jsonschema: %s", stderr.String())
	var verdicts []bool
	require.NoError(t, json.Unmarshal(out, &verdicts), "jsonschema said %q", out)
	return verdicts
}

// schemaPython is a Python with jsonschema: PEERKV_PYTHON, else the
// repository's .venv. Without one the test skips, or fails under
// PEERKV_REQUIRE_ORACLE=1 (as make test runs it).
func schemaPython(t *testing.T) string {
	py := os.Getenv("PEERKV_PYTHON")
	if py == "" {
		py = "../../.venv/bin/python"
	}
	path, err := exec.LookPath(py)
	if err == nil {
		err = exec.Command(path, "-c", "import jsonschema").Run()
	}
	if err != nil {
		msg := "no Python with jsonschema to check the schema (" + py + ": " + err.Error() + "); set PEERKV_PYTHON"
		if os.Getenv("PEERKV_REQUIRE_ORACLE") == "1" {
			t.Fatal(msg + " (PEERKV_REQUIRE_ORACLE=1)")
		}
		t.Skip(msg + "; PEERKV_REQUIRE_ORACLE=1 makes this a failure")
	}
	return path
}

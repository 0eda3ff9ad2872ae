package nixl

import (
	"os"
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestInterpreterPrefixFollowsArgv0LikePython(t *testing.T) {
	saved := os.Args
	defer func() { os.Args = saved }()
	for argv0, want := range map[string]string{
		"/srv/venv/bin/python3":    "/srv/venv", // a venv's python is a symlink: argv[0], not the resolved exe
		"/srv/venv/bin/python3.11": "/srv/venv",
		"python3":                  "", // found on $PATH, searched there
		"/srv/venv/bin/vllm":       "", // not an interpreter
	} {
		os.Args = []string{argv0}
		assert.Equal(t, want, interpreterPrefix(), argv0)
	}
}

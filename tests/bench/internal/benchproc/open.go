package benchproc

import (
	"errors"
	"fmt"
	"net"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/node"
	"github.com/peerkv/peerkv/core/tier"
)

// Open starts a peer the way the library does from an engine's options:
// configJSON returns the JSON options for a control port, a free one on
// 127.0.0.1 is picked, and one taken meanwhile is retried with another.
func Open(region data.Region, configJSON func(port int) string) (*tier.Tier, error) {
	var lastErr error
	for range 20 {
		port, err := FreePort()
		if err != nil {
			return nil, err
		}
		cfg, err := config.FromJSON([]byte(configJSON(port)))
		if err != nil {
			return nil, fmt.Errorf("config: %w", err)
		}
		t, err := node.Open(cfg, region)
		if err == nil || !errors.Is(err, node.ErrTransport) {
			return t, err
		}
		lastErr = err // the port was taken meanwhile
	}
	return nil, lastErr
}

// FreePort is a TCP port on 127.0.0.1 free a moment ago; callers retry if
// another process takes it meanwhile.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Package node wires one peer: the ZMQ control transport, the data transport
// chosen by the configuration, and the tier on top. It keeps capi thin and is
// the one place that knows which concrete transports exist.
package node

import (
	"errors"
	"fmt"
	"log/slog"
	"os"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/control/zmqctl"
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/data/tcpdata"
	"github.com/peerkv/peerkv/core/tier"
	"github.com/peerkv/peerkv/nixl"
)

// ErrTransport marks a failure to bind or start a transport.
var ErrTransport = errors.New("transport failure")

// ErrUnavailable marks a feature this host cannot provide (NIXL not
// installed); its messages read "NIXL unavailable: ...".
var ErrUnavailable = nixl.ErrUnavailable

// Open builds a peer bound at cfg.Host:cfg.Port serving region. cfg must
// have its defaults applied (config.FromJSON does).
func Open(cfg config.Config, region data.Region) (*tier.Tier, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", tier.ErrInvalidArgument, err)
	}
	ctl, err := zmqctl.New(cfg.LocalID(), cfg.Host, cfg.Port, zmqctl.Options{
		ConnectTimeout: cfg.HandshakeTimeout,
		Logger:         transportLogger,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: control path at %s: %v", ErrTransport, cfg.LocalID(), err)
	}
	t, err := tier.New(cfg, region, tier.Deps{
		Control: ctl,
		NewData: func(guard data.WriteGuard) (data.Transport, error) { return newData(cfg, region, guard) },
	})
	if err != nil {
		_ = ctl.Close()
		return nil, err
	}
	return t, nil
}

// newData builds the data transport named by cfg.DataTransport.
func newData(cfg config.Config, region data.Region, guard data.WriteGuard) (data.Transport, error) {
	switch cfg.DataTransport {
	case "tcp":
		t, err := tcpdata.New(tcpdata.Options{
			LocalID:    cfg.LocalID(),
			Region:     region,
			Guard:      guard,
			ListenHost: cfg.DataHost,
			ListenPort: cfg.DataPort,
			AuthSecret: cfg.AuthSecret,
			// A stalled socket must fail well before the load deadline.
			IOTimeout: min(tcpdata.DefaultIOTimeout, cfg.LoadTimeout),
		})
		if err != nil {
			return nil, fmt.Errorf("%w: data path at %s:%d: %v", ErrTransport, cfg.DataHost, cfg.DataPort, err)
		}
		return t, nil
	case "nixl":
		t, err := nixl.New(nixl.Options{
			Region:          region,
			LibPath:         cfg.NixlLibrary,
			Backends:        cfg.NixlBackends,
			NumThreads:      cfg.NixlNumThreads,
			TransferTimeout: cfg.LoadTimeout,
		})
		if err != nil {
			if errors.Is(err, nixl.ErrUnavailable) {
				return nil, err
			}
			return nil, fmt.Errorf("%w: NIXL data path: %v", ErrTransport, err)
		}
		return t, nil
	}
	return nil, fmt.Errorf("%w: data_transport %q", tier.ErrInvalidArgument, cfg.DataTransport)
}

// NixlStatus is "ok" when NIXL can be loaded here, else why not.
func NixlStatus() string {
	if ok, why := nixl.Available(); !ok {
		return why
	}
	return "ok"
}

// transportLogger reports only transport errors, on stderr: the tier already
// reports peer loss through its own log queue (peerkv_take_logs), and a host
// process's stderr is not ours to fill with routine warnings.
var transportLogger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))

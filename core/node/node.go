// Package node wires one node (this side; its peers are the remote nodes):
// the ZMQ control transport, the data transport chosen by the
// configuration, and the tier on top. It keeps capi thin and is the one
// place that knows which concrete transports exist.
package node

import (
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/peerkv/peerkv/core/config"
	"github.com/peerkv/peerkv/core/control/zmqctl"
	"github.com/peerkv/peerkv/core/data"
	"github.com/peerkv/peerkv/core/data/multipath"
	"github.com/peerkv/peerkv/core/data/shmdata"
	"github.com/peerkv/peerkv/core/data/tcpdata"
	"github.com/peerkv/peerkv/core/tier"
	"github.com/peerkv/peerkv/nixl"
)

// ErrTransport marks a failure to bind or start a transport.
var ErrTransport = errors.New("transport failure")

// ErrUnavailable marks a feature this host cannot provide (NIXL not
// installed); its messages read "NIXL unavailable: ...".
var ErrUnavailable = nixl.ErrUnavailable

// Open builds a node bound at cfg.Host:cfg.Port serving region. cfg must
// have its defaults applied (config.FromJSON does).
func Open(cfg config.Config, region data.Region) (*tier.Tier, error) {
	cfg = cfg.WithServedLimits(region.NumRows())
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", tier.ErrInvalidArgument, err)
	}
	procs := sizeGoRuntime(cfg.GoMaxProcs) // before the paths size their workers from it
	logs := &transportLog{}
	var curve *zmqctl.CurveKeys
	if cfg.Encrypt {
		keys, err := zmqctl.DeriveCurveKeys(cfg.AuthSecret)
		if err != nil {
			return nil, fmt.Errorf("%w: control path encryption: %v", ErrTransport, err)
		}
		curve = &keys
	}
	ctl, err := zmqctl.New(cfg.LocalID(), cfg.Host, cfg.Port, zmqctl.Options{
		ConnectTimeout: cfg.HandshakeTimeout,
		MaxFrameBytes:  cfg.MaxFrameBytes,
		// Room for every session admission allows, and a redial each.
		MaxInboundConns:        max(zmqctl.DefaultMaxInboundConns, 2*cfg.MaxPeers),
		MaxInboundConnsPerHost: max(zmqctl.DefaultMaxInboundConnsPerHost, 2*cfg.MaxPeersPerHost),
		// A cluster may sit in one subnet: room for all of it there.
		MaxInboundConnsPerNetwork: max(zmqctl.DefaultMaxInboundConnsPerNetwork, 2*cfg.MaxPeers),
		AdmitAddr:                 admitAddr(cfg),
		Curve:                     curve,
		Logger:                    logs.logger(),
	})
	if err != nil {
		return nil, fmt.Errorf("%w: control path at %s: %v", ErrTransport, cfg.LocalID(), err)
	}
	t, err := tier.New(cfg, region, tier.Deps{
		Control:            ctl,
		NotAllowedAtAccept: func() uint64 { return ctl.Stats().InboundNotAdmitted },
		NewData: func(guard data.WriteGuard, logf tier.Logf) (data.Transport, error) {
			logs.attach(logf)
			logf("INFO", "%s", procs)
			return newData(cfg, region, guard, logf)
		},
	})
	if err != nil {
		_ = ctl.Close()
		return nil, err
	}
	return t, nil
}

// newData builds the data paths cfg.DataTransport asks for, behind one
// multipath transport that picks a path per peer.
func newData(cfg config.Config, region data.Region, guard data.WriteGuard, logf tier.Logf) (data.Transport, error) {
	var paths []data.Transport
	var missing string
	closeAll := func() {
		for _, p := range paths {
			_ = p.Close()
		}
	}
	switch cfg.DataTransport {
	case config.DataAuto:
		// Same-host peers first: a direct copy beats any transport.
		if !cfg.NoSameHostCopy {
			shm, err := shmdata.New(shmdata.Options{
				Region:          region,
				LocalID:         cfg.LocalID(),
				TransferTimeout: cfg.LoadTimeout,
				Logf:            func(format string, args ...any) { logf("WARNING", format, args...) },
			})
			if err != nil {
				logf("WARNING", "no same-host copy path: %v", err)
			} else {
				paths = append(paths, shm)
			}
		}
		if cfg.AuthSecret != "" {
			missing = "NIXL is off because auth_secret is set: NIXL writes can be neither authenticated nor " +
				"guarded (set data_transport \"nixl\" to use it anyway)"
		} else if nx, err := newNixl(cfg, region); err != nil {
			missing = err.Error()
		} else {
			paths = append(paths, nx)
		}
		if missing != "" {
			logf("WARNING", "no NIXL data path, so stock vLLM peers cannot be served (peerkv peers still can): %s",
				missing)
		}
	case "nixl":
		nx, err := newNixl(cfg, region)
		if err != nil {
			return nil, err
		}
		paths = append(paths, nx)
		missing = "TCP is off (data_transport \"nixl\")"
	case "tcp":
		missing = "NIXL is off (data_transport \"tcp\"; stock vLLM peers need \"auto\" or \"nixl\")"
	default:
		return nil, fmt.Errorf("%w: data_transport %q", tier.ErrInvalidArgument, cfg.DataTransport)
	}
	if cfg.DataTransport != "nixl" {
		tcp, err := newTCP(cfg, region, guard, logf)
		if err != nil {
			closeAll()
			return nil, err
		}
		paths = append(paths, tcp)
	}
	mp, err := multipath.New(missing, paths...)
	if err != nil {
		closeAll()
		return nil, err
	}
	return mp, nil
}

// dataAdvertiseHost is the host peers dial for our TCP data listener when
// it binds a wildcard ("" otherwise: the bound address is dialable).
func dataAdvertiseHost(cfg config.Config) string {
	if config.IsWildcard(cfg.DataHost) {
		return cfg.IdentityHost()
	}
	return ""
}

func newTCP(cfg config.Config, region data.Region, guard data.WriteGuard, logf tier.Logf) (data.Transport, error) {
	t, err := tcpdata.New(tcpdata.Options{
		LocalID:    cfg.LocalID(),
		Region:     region,
		Guard:      guard,
		ListenHost: cfg.DataHost,
		ListenPort: cfg.DataPort,
		// A wildcard listener is dialed at the node's identity host.
		AdvertiseHost: dataAdvertiseHost(cfg),
		AuthSecret:    cfg.AuthSecret,
		Encrypt:       cfg.Encrypt,
		// Only the session a peer holds with us may write into us, and
		// only while it lasts (its data token, sent in our connect).
		RequireGrant: true,
		// A stalled socket must fail well before the load deadline.
		IOTimeout: min(tcpdata.DefaultIOTimeout, cfg.LoadTimeout),
		Logf:      func(format string, args ...any) { logf("WARNING", format, args...) },
	})
	if errors.Is(err, syscall.EADDRINUSE) {
		return nil, fmt.Errorf("%w: data path at %s:%d: data_port %d is in use by another process (the TCP data "+
			"port is port + %d + the DP rank unless data_port is set): stop what holds it, or set data_port to a "+
			"free port (0: an ephemeral one)", ErrTransport, cfg.DataHost, cfg.DataPort, cfg.DataPort, config.DataPortOffset)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: data path at %s:%d: %v", ErrTransport, cfg.DataHost, cfg.DataPort, err)
	}
	return t, nil
}

// newNixl starts the NIXL path; errors wrap nixl.ErrUnavailable when the
// library cannot be loaded here, else ErrTransport.
func newNixl(cfg config.Config, region data.Region) (data.Transport, error) {
	t, err := nixl.New(nixl.Options{
		Region:          region,
		LibPath:         cfg.NixlLibrary,
		SearchPrefixes:  []string{cfg.PythonPrefix}, // "" is skipped
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

// NixlStatus is "ok" when NIXL can be loaded here, else why not.
func NixlStatus() string {
	if ok, why := nixl.Available(); !ok {
		return why
	}
	return "ok"
}

// DataPathStatus says, for each data path, "ok" when this host can serve
// it, else why not (what data_transport "auto" would log at start).
func DataPathStatus() map[string]string {
	shm := "ok (peerkv peers on this host; the region must be a shared file mapping, as vLLM's /dev/shm region is)"
	if err := shmdata.Probe(); err != nil {
		shm = err.Error()
	}
	nx := "ok (stock vLLM peers, RDMA where UCX has it)"
	if ok, why := nixl.Available(); ok {
		nx = "ok (" + why + ")"
	} else {
		nx = "unavailable, so stock vLLM peers cannot be served: " + strings.TrimPrefix(why, "NIXL unavailable: ")
	}
	return map[string]string{"shm": shm, "nixl": nx, "tcp": "ok (peerkv peers)"}
}

// transportLog carries the control transport's warnings and errors into the
// tier's log (peerkv_take_logs, which vLLM's logger prints) once the tier
// exists, and to stderr before that. Routine events stay out: the tier
// already logs what a peer loss means for requests.
type transportLog struct {
	logf atomic.Pointer[tier.Logf]
}

func (l *transportLog) attach(logf tier.Logf) { l.logf.Store(&logf) }

func (l *transportLog) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{
		Level: slog.LevelWarn,
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{} // the host's logger stamps the time
			}
			return a
		},
	}))
}

// Write receives one formatted record ("level=WARN msg=... k=v\n").
func (l *transportLog) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	logf := l.logf.Load()
	if logf == nil {
		fmt.Fprintln(os.Stderr, "peerkv control transport:", line)
		return len(p), nil
	}
	level := "WARNING"
	if strings.HasPrefix(line, "level=ERROR") {
		level = "ERROR"
	}
	// The tier rate-limits lines per format string: the record's level and
	// message (a constant in zmqctl) go into the format, so one flooded
	// warning cannot silence the others.
	cause, attrs := splitRecord(line)
	(*logf)(level, "control transport: "+strings.ReplaceAll(cause, "%", "%%")+"%s", attrs)
	return len(p), nil
}

// splitRecord splits a text record after its msg value.
func splitRecord(line string) (cause, attrs string) {
	i := strings.Index(line, " msg=")
	if i < 0 {
		return "", line
	}
	end := i + len(" msg=")
	if rest := line[end:]; strings.HasPrefix(rest, `"`) {
		q, err := strconv.QuotedPrefix(rest)
		if err != nil {
			return "", line
		}
		end += len(q)
	} else if j := strings.IndexByte(rest, ' '); j >= 0 {
		end += j
	} else {
		end = len(line)
	}
	return line[:end], line[end:]
}

// admitAddr is allowed_peers as the control transport applies it to the
// connections it accepts (nil when the option is unset: every address),
// so that a host outside the list holds nothing in libzmq; the tier checks
// each connect against the same list.
func admitAddr(cfg config.Config) func(netip.Addr) bool {
	peers, err := config.ParsePeerList(cfg.AllowedPeers)
	if err != nil || peers.AllowsAll() {
		return nil // a bad list is refused by the tier's own check
	}
	return func(a netip.Addr) bool { return peers.AllowsAddr(a.String()) }
}

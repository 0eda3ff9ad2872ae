package zmqctl

import (
	"fmt"
	"time"

	zmq "github.com/pebbe/zmq4"
)

// maxUnbindWait bounds the wait for the I/O thread to close the ROUTER's
// listening socket; it takes a command round trip, well under a
// millisecond when the host is not overloaded.
const maxUnbindWait = 2 * time.Second

// closeRouter closes the ROUTER, its port free when it returns. In the
// shared context that no longer comes with Term (other Transports keep
// the context), and a Transport reopened on the same port, as a restarted
// peer is, must be able to bind at once.
func (p *pump) closeRouter() {
	if p.router == nil {
		return
	}
	p.stopRouterMonitor()
	if p.bound {
		if err := p.unbindRouter(); err != nil {
			p.t.log.Warn("router port may still be held after close", "err", err)
		}
		p.bound = false
	}
	p.router.Close()
	p.router = nil
}

// unbindRouter unbinds the ROUTER and waits for libzmq to report its
// listener closed. The event comes from the I/O thread with a blocking
// send, so the monitor's reader connects before the unbind and the
// monitor stops before the reader closes, as for a DEALER's monitor.
func (p *pump) unbindRouter() (err error) {
	endpoint, err := p.router.GetLastEndpoint()
	if err != nil {
		return fmt.Errorf("router endpoint: %w", err)
	}
	monitorAddr := nextMonitorAddr()
	if err := p.router.Monitor(monitorAddr, zmq.EVENT_CLOSED|zmq.EVENT_CLOSE_FAILED); err != nil {
		return fmt.Errorf("monitor router: %w", err)
	}
	var reader *zmq.Socket
	defer func() {
		_ = p.router.Monitor("", 0)
		if reader != nil {
			reader.Close()
		}
	}()
	if reader, err = newSocket(p.ctx, zmq.PAIR); err != nil {
		return err
	}
	if err := reader.Connect(monitorAddr); err != nil {
		return fmt.Errorf("connect router monitor: %w", err)
	}
	if err := reader.SetRcvtimeo(min(maxUnbindWait, p.t.opts.CloseTimeout/2)); err != nil {
		return fmt.Errorf("router monitor timeout: %w", err)
	}
	if err := p.router.Unbind(endpoint); err != nil {
		return fmt.Errorf("unbind %s: %w", endpoint, err)
	}
	event, _, _, err := reader.RecvEvent(0)
	switch {
	case err != nil:
		return fmt.Errorf("listener %s not closed: %w", endpoint, err)
	case event != zmq.EVENT_CLOSED:
		return fmt.Errorf("listener %s: %v", endpoint, event)
	}
	return nil
}

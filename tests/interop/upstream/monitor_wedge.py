"""Reproduces a libzmq hazard that vLLM's control transport (zmq.py) runs into.

libzmq's I/O thread sends socket-monitor events with a *blocking* send. vLLM's
ZmqConnection.close() closes the monitor's reading PAIR before the DEALER (and
the DEALER then lingers 500 ms); if the peer drops the connection in that
window, the "disconnected"/"closed" event blocks the I/O thread forever and
every other socket of the context stops: no later connection completes its
ZMTP handshake. peerkv hit the same bug in core/control/zmqctl and now stops
the monitor (zmq_socket_monitor(s, NULL, 0)) before closing anything.

Run: .venv/bin/python tests/interop/upstream/monitor_wedge.py
Prints "wedged" on an affected libzmq (4.3.5 in pyzmq 27.3.0, 4.3.4 on Debian 12).
Not a test: it documents an upstream issue, see docs/compatibility.md.
"""

import os
import socket
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dial(ctx: zmq.Context, addr: str, monitor_addr: str) -> tuple[zmq.Socket, zmq.Socket]:
    dealer = ctx.socket(zmq.DEALER)
    dealer.monitor(monitor_addr, EVENTS)
    monitor = ctx.socket(zmq.PAIR)
    monitor.connect(monitor_addr)
    dealer.connect(addr)
    return dealer, monitor


def main() -> None:
    ctx, remote_ctx = zmq.Context(), zmq.Context()
    remote = remote_ctx.socket(zmq.ROUTER)
    addr = f"tcp://127.0.0.1:{free_port()}"
    remote.bind(addr)
    dealer, monitor = dial(ctx, addr, "inproc://first")
    assert recv_monitor_message(monitor)["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED

    monitor.close()  # as ZmqConnection.close(): the monitor's reader first
    remote.setsockopt(zmq.LINGER, 0)
    remote.close()  # the peer drops while our DEALER still exists
    time.sleep(0.5)
    dealer.close()

    other = remote_ctx.socket(zmq.ROUTER)
    other_addr = f"tcp://127.0.0.1:{free_port()}"
    other.bind(other_addr)
    _, monitor2 = dial(ctx, other_addr, "inproc://second")
    monitor2.setsockopt(zmq.RCVTIMEO, 3000)
    try:
        recv_monitor_message(monitor2)
        print("ok: a later connection completed its handshake")
    except zmq.Again:
        print("wedged: no later connection of this context completes its ZMTP handshake")
    os._exit(0)  # ctx.term() would hang on the wedged I/O thread


if __name__ == "__main__":
    main()

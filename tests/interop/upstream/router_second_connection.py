"""Reproduces the libzmq ROUTER behaviour behind lost control frames after a re-dial.

A ROUTER without ZMQ_ROUTER_HANDOVER (vLLM's p2p tier sets none) reads a new
connection's routing id, finds it held by an older connection and never reads
the new connection again, even once the older one has gone: every frame on
it is lost, with no error on either side. A sender that closes its DEALER
(vLLM's lingers 500 ms) and dials a new one to the same peer while the old
connection is still up at the receiver is in that case. vLLM's zmq.py does so
when it reconnects right after a session died; peerkv's zmqctl did so after
a Disconnect until it kept the disconnected DEALER for reuse instead.

Run: .venv/bin/python tests/interop/upstream/router_second_connection.py
Prints "unheard" for the ROUTER without handover, "heard" with it.
Not a test: it documents an upstream issue, see docs/compatibility.md.
"""

import socket

import zmq

IDENTITY = b"127.0.0.1:5710"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def dial(ctx: zmq.Context, addr: str) -> zmq.Socket:
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.IDENTITY, IDENTITY)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(addr)
    return dealer


def heard(router: zmq.Socket, want: bytes, timeout_ms: int = 1000) -> bool:
    while router.poll(timeout_ms):
        identity, frame = router.recv_multipart()
        if identity == IDENTITY and frame == want:
            return True
    return False


def second_connection_heard(handover: bool) -> bool:
    ctx = zmq.Context()
    try:
        router = ctx.socket(zmq.ROUTER)
        router.setsockopt(zmq.LINGER, 0)
        router.setsockopt(zmq.ROUTER_HANDOVER, int(handover))
        addr = f"tcp://127.0.0.1:{free_port()}"
        router.bind(addr)
        old = dial(ctx, addr)
        old.send(b"first")
        assert heard(router, b"first"), "the first connection was not heard"
        new = dial(ctx, addr)  # the sender re-dials while the old connection is up
        new.send(b"second")
        ok = heard(router, b"second")
        old.close()  # the old connection goes away: the new one stays unread
        new.send(b"third")
        ok = heard(router, b"third") or ok
        new.close()
        router.close()
        return ok
    finally:
        ctx.term()


def main() -> None:
    print(f"libzmq {zmq.zmq_version()}, pyzmq {zmq.pyzmq_version()}")
    for handover in (False, True):
        verdict = "heard" if second_connection_heard(handover) else "unheard"
        print(f"ROUTER_HANDOVER={int(handover)}: a second connection under one identity is {verdict}")


if __name__ == "__main__":
    main()

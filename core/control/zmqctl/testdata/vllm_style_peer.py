"""A pyzmq peer built the way vLLM's p2p control/zmq.py builds its sockets.

Usage: vllm_style_peer.py HOST PORT GO_PEER_ID
Binds a ROUTER at tcp://HOST:PORT, opens a DEALER with identity "HOST:PORT"
to GO_PEER_ID, sends b"hello from python", then echoes every frame it
receives as b"echo:" + payload and reports each sender identity on stdout.
Exits after two echoes, or with status 2 after 10 s.
"""

import sys
import time

import zmq

HEARTBEAT_MS = (2000, 10000, 10000)  # IVL, TIMEOUT, TTL as in vLLM


def heartbeat(sock):
    ivl, timeout, ttl = HEARTBEAT_MS
    sock.setsockopt(zmq.HEARTBEAT_IVL, ivl)
    sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, timeout)
    sock.setsockopt(zmq.HEARTBEAT_TTL, ttl)


def main():
    host, port, go_peer = sys.argv[1], sys.argv[2], sys.argv[3]
    local_id = f"{host}:{port}"
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    heartbeat(router)
    try:
        router.bind(f"tcp://{host}:{port}")
    except zmq.ZMQError as exc:
        print(f"BINDFAIL {exc}", flush=True)
        ctx.destroy(linger=0)
        return 3

    peer_host, peer_port = go_peer.rsplit(":", 1)
    dealer = ctx.socket(zmq.DEALER)
    heartbeat(dealer)
    dealer.identity = local_id.encode()
    dealer.setsockopt(zmq.SNDHWM, 1000)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(f"tcp://{peer_host}:{peer_port}")
    print("READY", flush=True)
    dealer.send(b"hello from python", zmq.NOBLOCK)

    echoed = 0
    deadline = time.monotonic() + 10
    while echoed < 2 and time.monotonic() < deadline:
        if not router.poll(100):
            continue
        frames = router.recv_multipart(zmq.NOBLOCK)
        if len(frames) != 2:
            print(f"BADFRAMES {len(frames)}", flush=True)
            continue
        identity, payload = frames
        print(f"FROM {identity.decode()} {payload.hex()}", flush=True)
        dealer.send(b"echo:" + payload, zmq.NOBLOCK)
        echoed += 1
    time.sleep(0.2)  # let the last echo leave before linger-0 teardown
    ctx.destroy(linger=0)
    return 0 if echoed == 2 else 2


if __name__ == "__main__":
    sys.exit(main())

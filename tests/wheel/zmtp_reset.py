"""A stranger that fills a control connection and resets it must not abort
the engine process (the wheel's libzmq carries
scripts/wheel/patches/libzmq-4.3.4-io-error-no-abort.patch).

libzmq 4.3.4 asserts when a connection fails while its input is stopped:
the heartbeat timer, or a PING still in the input buffer, writes to it. A
ROUTER never reads a connection whose routing id is already taken, so its
input stops after RCVHWM frames; the stranger then sends a PING and resets
the connection. Unpatched, the process dies with "Assertion failed:
!_io_error" at the next heartbeat (5 s).

    python zmtp_reset.py     # prints one JSON line once the peer outlived the attack

Raw sockets only: the hidden view has no libzmq for an attacker to use.
"""

from __future__ import annotations

import json
import socket
import struct
import sys
import threading
import time
from pathlib import Path

import peerkv

sys.path.append(str(Path(__file__).resolve().parents[1] / "python"))  # loopback_ports only, after the wheel's peerkv
from loopback_ports import control_port  # noqa: E402

IDENTITY = b"stranger-1"


def greeting() -> bytes:
    """ZMTP 3.1, NULL mechanism, as client."""
    return b"\xff" + b"\x00" * 8 + b"\x7f" + b"\x03\x01" + b"NULL".ljust(20, b"\x00") + b"\x00" + b"\x00" * 31


def prop(name: bytes, value: bytes) -> bytes:
    return bytes([len(name)]) + name + struct.pack(">I", len(value)) + value


def command(body: bytes) -> bytes:
    return b"\x04" + bytes([len(body)]) + body


def message(body: bytes) -> bytes:
    if len(body) < 256:
        return b"\x00" + bytes([len(body)]) + body
    return b"\x02" + struct.pack(">Q", len(body)) + body


def dial(port: int) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    s.sendall(greeting())
    s.sendall(command(b"\x05READY" + prop(b"Socket-Type", b"DEALER") + prop(b"Identity", IDENTITY)))
    # Frames sent before the node's READY arrives fail the handshake: wait for it.
    recv_exactly(s, 64)
    flags, size = recv_exactly(s, 2)
    assert flags == 0x04, f"expected the node's READY command, got flags {flags:#x}"
    recv_exactly(s, size)
    return s


def recv_exactly(s: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = s.recv(n - len(out))
        if not chunk:
            raise ConnectionError("the node closed the connection during the handshake")
        out += chunk
    return out


def keep_talking(port: int, stop: threading.Event) -> None:
    """The identity's first connection: it keeps sending, so it is the live
    one and the second stays a never-read duplicate."""
    s = dial(port)
    while not stop.is_set():
        s.sendall(message(b"\x80"))  # an empty msgpack map: dropped, no session
        stop.wait(0.05)
    s.close()


def main() -> int:
    port = control_port()
    region = bytearray(4 * 4096)
    opts = {"host": "127.0.0.1", "port": port, "data_port": 0, "key_len": 36, "data_transport": "tcp"}
    with peerkv.Node(region, 4, 4096, opts) as peer:
        stop = threading.Event()
        talker = threading.Thread(target=keep_talking, args=(port, stop), daemon=True)
        talker.start()
        time.sleep(0.5)
        dup = dial(port)
        dup.sendall(b"".join(message(b"\x80" * 4096) for _ in range(64)))  # fills its input: never read
        dup.sendall(command(b"\x04PING" + b"\x00\x00"))
        time.sleep(0.5)
        dup.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        dup.close()  # RST
        deadline = time.monotonic() + 12  # past two heartbeat intervals
        while time.monotonic() < deadline:
            peer.get_finished()
            time.sleep(0.05)
        stop.set()
        talker.join(5)
        stats = peer.stats()
        peer.shutdown()
    print(json.dumps({"survived": True, "frames_in": stats.get("frames_in"),
                      "dropped_frames": stats.get("dropped_frames")}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

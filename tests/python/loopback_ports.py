"""Loopback ports for test processes to bind, with no dependency beyond the
standard library (the engine suite imports it without vLLM's test stubs)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

_ISSUED_PORTS: set[int] = set()


def control_port() -> int:
    """A free loopback port below Linux's ephemeral range (32768+).

    A port from bind(0) is itself ephemeral: between closing it and the tier
    binding it, a UCX listener or an outgoing connection in one of the five
    node processes may take it, and a peer then dials something that never
    speaks ZMTP. Ports below the range are only ever taken by explicit binds.
    """
    low, _ = _ephemeral_range()
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20000, min(low, 32768))
        if port in _ISSUED_PORTS:
            continue
        try:
            for family, host in ((socket.AF_INET, "0.0.0.0"), (socket.AF_INET, "127.0.0.1")):
                with socket.socket(family, socket.SOCK_STREAM) as probe:
                    probe.bind((host, port))
        except OSError:
            continue
        _ISSUED_PORTS.add(port)
        return port
    raise RuntimeError("no free port below the ephemeral range in 200 tries")


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999

"""Standalone peers for the command line (`peerkv serve`, `bench`, `doctor`).

`serve` and `bench` use synthetic rows: both sides derive the same keys and
row contents from the row index, so the bench checks every byte it pulled
without a model."""

from __future__ import annotations

import hashlib
import mmap
import os
import socket

KEY_LEN = 32
DEFAULT_ROWS = 256
DEFAULT_ROW_LEN = 2 << 20  # 2 MiB, a typical KV block row


def key(index: int) -> bytes:
    return hashlib.sha256(b"peerkv synthetic row %d" % index).digest()


def row(index: int, row_len: int) -> bytes:
    seed = hashlib.blake2b(b"%d" % index).digest()
    return (seed * (row_len // len(seed) + 1))[:row_len]


def region(rows: int, row_len: int) -> mmap.mmap:
    """A shared file mapping (memfd), as vLLM's /dev/shm region is: the
    same-host path can only grant memory-backed files."""
    fd = os.memfd_create("peerkv-synthetic", os.MFD_CLOEXEC)
    try:
        os.ftruncate(fd, rows * row_len)
        return mmap.mmap(fd, rows * row_len, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


def split_endpoint(endpoint: str) -> tuple[str, int]:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"{endpoint!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def local_address(host: str, port: int) -> str:
    """The address of this machine the peer can reach us at (it dials back)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((host, port))  # UDP: picks the route, sends nothing
        return s.getsockname()[0]


def free_port(address: str) -> int:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def secret_options(args) -> dict:
    out = {}
    if getattr(args, "auth_secret_file", None):
        out["auth_secret_file"] = args.auth_secret_file
    if getattr(args, "data_transport", None):
        out["data_transport"] = args.data_transport
    return out

"""Upstream baseline for tests/bench/datapath: stock vLLM's NixlTransport
(the data path of vLLM's built-in p2p tier) moving ROWS x ROW_MIB rows between
two processes, timed like the Go bench (one warm-up, median of ITERS).

Usage: python upstream_nixl.py ROWS ROW_MIB ITERS
Prints one line: "upstream vllm-nixl ROWSxROW_MIBMiB: <GB/s> GB/s verified"
(GB = 10^9 bytes), or "upstream unavailable: <why>". The receiver checks a
SHA-256 of everything that arrived.
"""

import hashlib
import json
import mmap
import os
import statistics
import subprocess
import sys
import time
import uuid

os.environ.setdefault("UCX_HANDLE_ERRORS", "none")

# Our protocol owns the real stdout; vLLM's and NIXL's logs go to stderr.
PROTO = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr

PEER = "receiver"


def transport_for(region: mmap.mmap, rows: int, row_len: int):
    from vllm.v1.kv_offload.tiering.p2p.data.nixl import NixlTransport

    t = NixlTransport(str(uuid.uuid4()), memoryview(region).cast("B", (rows, row_len)))
    if not t.available:
        raise RuntimeError("vLLM NixlTransport unavailable (nixl not importable)")
    return t


def say(obj: dict) -> None:
    PROTO.write(json.dumps(obj) + "\n")
    PROTO.flush()


def receiver(rows: int, row_len: int) -> None:
    region = mmap.mmap(-1, rows * row_len)
    t = transport_for(region, rows, row_len)
    say({"agent_metadata": t.get_agent_metadata().hex(), "base_addr": t.base_addr})
    for line in sys.stdin:  # "digest" until stdin closes
        say({"sha256": hashlib.sha256(region).hexdigest()})
    t.close()


def write_all(t, rows: int) -> None:
    ids = list(range(rows))
    tid = t.write_blocks(PEER, ids, ids)
    if tid is None:
        raise RuntimeError("write_blocks refused the transfer")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        result = t.poll(PEER)
        if tid in result.done:
            return
        if tid in result.failed:
            raise RuntimeError(f"transfer failed: {result}")
        time.sleep(0.0002)
    raise RuntimeError("transfer not done within 60 s")


def sender(rows: int, row_mib: int, iters: int) -> None:
    row_len = row_mib << 20
    child = subprocess.Popen(
        [sys.executable, __file__, "--receiver", str(rows), str(row_len)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    try:
        hello = json.loads(child.stdout.readline())
        region = mmap.mmap(-1, rows * row_len)
        region[:] = os.urandom(rows * row_len)
        t = transport_for(region, rows, row_len)
        t.add_remote_peer(PEER, bytes.fromhex(hello["agent_metadata"]), hello["base_addr"], rows, row_len)
        rates = []
        for i in range(iters + 1):
            start = time.perf_counter()
            write_all(t, rows)
            if i:
                rates.append(rows * row_len / (time.perf_counter() - start) / 1e9)
        child.stdin.write("digest\n")
        child.stdin.flush()
        got = json.loads(child.stdout.readline())["sha256"]
        if got != hashlib.sha256(region).hexdigest():
            raise RuntimeError("receiver's bytes differ from what was sent")
        say({"line": f"upstream vllm-nixl {rows}x{row_mib}MiB: {statistics.median(rates):.2f} GB/s verified"})
        t.close()
    finally:
        child.stdin.close()
        child.wait(timeout=30)


def main() -> None:
    try:
        if sys.argv[1] == "--receiver":
            receiver(int(sys.argv[2]), int(sys.argv[3]))
        else:
            sender(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
    except Exception as exc:  # the Go bench prints it and carries on
        say({"line": f"upstream unavailable: {type(exc).__name__}: {exc}"})


if __name__ == "__main__":
    main()

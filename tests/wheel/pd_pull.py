"""A PD pull between two processes through the installed peerkv wheel alone
(no vLLM, no source tree): a prefiller stores rows, a decoder in another
process pulls them over the real path -- ZMQ control (CURVE with
--encrypt), TCP data (TLS with --encrypt) -- and checks every byte.

    python pd_pull.py [--encrypt] [--prefiller-library SO]   # the decoder; starts the prefiller itself

--prefiller-library runs the prefiller on another build of libpeerkv.so
(PEERKV_LIBRARY in its environment): a mixed cluster.

Prints one JSON line: where peerkv and its library were loaded from, the
library's version and the bytes pulled.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import peerkv

sys.path.append(str(Path(__file__).resolve().parents[1] / "python"))  # loopback_ports only, after the wheel's peerkv
from loopback_ports import control_port  # noqa: E402

KEY_LEN = 36
ROWS, ROW_LEN = 16, 64 * 1024
N_KEYS = 12
KID = "wheel-pd-1"


def options(port: int, encrypt: bool) -> dict:
    opts = {"host": "127.0.0.1", "port": port, "data_port": 0, "key_len": KEY_LEN, "data_transport": "tcp",
            "handshake_timeout_s": 20.0, "lookup_timeout_s": 10.0, "load_timeout_s": 20.0,
            "drain_timeout_s": 2.0}
    if encrypt:
        opts["encrypt"] = True  # the secret comes from PEERKV_AUTH_SECRET
    return opts


def keys() -> list[bytes]:
    return [bytes([i]) * 32 + (0).to_bytes(4, "big") for i in range(1, N_KEYS + 1)]


def row_pattern(key: bytes) -> bytes:
    return (key[:1] * ROW_LEN)[:ROW_LEN]


def pump(peer: peerkv.Node, finished: dict) -> None:
    for result in peer.get_finished():
        finished[result.job_id] = result
    while (item := peer.next_inbound()) is not None:
        if item.kind == peerkv.INBOUND_EVALUATE:
            peer.answer_inbound(item.lookup_id, [peerkv.LOOKUP_MISS] * len(item.keys))


def wait_line(stream, peer: peerkv.Node, finished: dict, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pump(peer, finished)
        ready, _, _ = select.select([stream], [], [], 0.01)
        if ready:
            line = stream.readline()
            if not line:
                raise SystemExit("the other process went away")
            return line.strip()
    raise SystemExit(f"no line within {timeout}s")


def prefiller(port: int, encrypt: bool) -> int:
    region = bytearray(ROWS * ROW_LEN)
    ks = keys()
    for slot, key in enumerate(ks):
        region[slot * ROW_LEN:(slot + 1) * ROW_LEN] = row_pattern(key)
    finished: dict = {}
    with peerkv.Node(region, ROWS, ROW_LEN, options(port, encrypt)) as peer:
        peer.request_start("prefill", {"remote_decoder": {"kv_request_id": KID}})
        peer.submit_store("prefill", 1, ks, list(range(len(ks))))
        peer.request_finish("prefill")
        print("stored", flush=True)
        assert wait_line(sys.stdin, peer, finished, 60) == "done"
        deadline = time.monotonic() + 10
        while 1 not in finished and time.monotonic() < deadline:
            pump(peer, finished)
            time.sleep(0.005)
        assert finished.get(1) is not None and finished[1].success, f"store job: {finished.get(1)}"
        peer.shutdown()
    print("bye", flush=True)
    return 0


def decoder(encrypt: bool, prefiller_library: str | None = None) -> int:
    producer_port, port = control_port(), control_port()
    env = dict(os.environ)
    if prefiller_library:
        env["PEERKV_LIBRARY"] = prefiller_library
    child = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--prefiller", str(producer_port)] + (["--encrypt"] if encrypt else []),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )
    try:
        region = bytearray(ROWS * ROW_LEN)
        finished: dict = {}
        with peerkv.Node(region, ROWS, ROW_LEN, options(port, encrypt)) as peer:
            assert wait_line(child.stdout, peer, finished, 90) == "stored"
            source = {"kv_request_id": KID, "remote_host": "127.0.0.1", "remote_port": producer_port}
            peer.request_start("decode", {"remote_prefiller": source})
            ks = keys()
            deadline = time.monotonic() + 30
            while True:
                results = peer.lookup("decode", ks)
                if peerkv.LOOKUP_RETRY not in results:
                    break
                assert time.monotonic() < deadline, f"lookup still RETRY: {results}"
                peer.on_schedule_end()
                pump(peer, finished)
                time.sleep(0.005)
            assert results == [peerkv.LOOKUP_HIT] * len(ks), results
            slots = [ROWS - 1 - i for i in range(len(ks))]
            peer.submit_load("decode", 7, ks, slots)
            deadline = time.monotonic() + 30
            while 7 not in finished:
                assert time.monotonic() < deadline, "load not reported"
                pump(peer, finished)
                time.sleep(0.002)
            job = finished[7]
            assert job.success and job.is_load, job
            for key, slot in zip(ks, slots):
                assert region[slot * ROW_LEN:(slot + 1) * ROW_LEN] == row_pattern(key), f"row {slot} corrupt"
            peer.request_finish("decode")
            stats = peer.stats()
            child.stdin.write("done\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "bye"
            peer.shutdown()
        assert child.wait(30) == 0
        print(json.dumps({
            "peerkv": peerkv.__file__, "library": str(peerkv.library_path()), "version": peerkv.version(),
            "package_version": peerkv.__version__, "bytes": job.bytes, "rows": len(ks), "encrypt": encrypt,
            "python": sys.version.split()[0], "data_paths": stats.get("data_paths"),
        }))
        return 0
    finally:
        if child.poll() is None:
            child.kill()


if __name__ == "__main__":
    encrypt = "--encrypt" in sys.argv
    if len(sys.argv) > 2 and sys.argv[1] == "--prefiller":
        sys.exit(prefiller(int(sys.argv[2]), encrypt))
    other = sys.argv[sys.argv.index("--prefiller-library") + 1] if "--prefiller-library" in sys.argv else None
    sys.exit(decoder(encrypt, other))

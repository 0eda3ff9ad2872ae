"""Test peer: stock vLLM NixlTransport (Python nixl) driven over stdin/stdout.

Usage: python vllm_peer.py NUM_ROWS ROW_LEN SEED

The region (an anonymous mmap, like a host-owned primary region) starts
filled with fill(SEED, i). Protocol, one JSON object per line:
  hello  -> {"agent_metadata": b64, "base_addr", "num_rows", "row_len"}
  {"op": "add_peer", "agent_metadata", "base_addr", "num_rows", "row_len"}
  {"op": "write", "src": [...], "dst": [...]}   waits for DONE (20 s)
  {"op": "rows", "rows": [...]}                -> {"data": b64}
  {"op": "quit"}
Each command answers {"ok": true, ...} or {"error": "..."}.
"""

import base64
import json
import mmap
import os
import sys
import time
import uuid

os.environ.setdefault("UCX_HANDLE_ERRORS", "none")

# The protocol gets the real stdout; everything else printed to fd 1 (vLLM's
# logger, NIXL's C++ logs) goes to stderr.
PROTO = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)
sys.stdout = sys.stderr

from vllm.v1.kv_offload.tiering.p2p.data.nixl import NixlTransport  # noqa: E402

PEER_ID = "go-peer"


def fill(seed: int, n: int) -> bytes:
    # Same formula as fillPattern in the Go tests.
    return bytes((i * 131 + seed * 17 + i // 4093) & 0xFF for i in range(n))


def main() -> None:
    num_rows, row_len, seed = (int(a) for a in sys.argv[1:4])
    region = mmap.mmap(-1, num_rows * row_len)
    region[:] = fill(seed, num_rows * row_len)
    transport = NixlTransport(str(uuid.uuid4()), memoryview(region).cast("B", (num_rows, row_len)))
    if not transport.available:
        reply({"error": "vLLM NixlTransport unavailable (nixl not importable)"})
        return
    reply({
        "agent_metadata": base64.b64encode(transport.get_agent_metadata()).decode(),
        "base_addr": transport.base_addr,
        "num_rows": num_rows,
        "row_len": row_len,
    })
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            op = cmd["op"]
            if op == "quit":
                transport.close()
                reply({"ok": True})
                return
            if op == "add_peer":
                transport.add_remote_peer(
                    PEER_ID,
                    base64.b64decode(cmd["agent_metadata"]),
                    cmd["base_addr"],
                    cmd["num_rows"],
                    cmd["row_len"],
                )
                reply({"ok": True})
            elif op == "write":
                reply(write(transport, cmd["src"], cmd["dst"]))
            elif op == "rows":
                data = b"".join(region[r * row_len:(r + 1) * row_len] for r in cmd["rows"])
                reply({"ok": True, "data": base64.b64encode(data).decode()})
            else:
                reply({"error": f"unknown op {op}"})
        except Exception as exc:  # reported to the Go test, which fails
            reply({"error": f"{type(exc).__name__}: {exc}"})


def write(transport: NixlTransport, src: list, dst: list) -> dict:
    tid = transport.write_blocks(PEER_ID, src, dst)
    if tid is None:
        return {"error": "write_blocks refused the transfer"}
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        result = transport.poll(PEER_ID)
        if tid in result.done:
            return {"ok": True}
        if tid in result.failed:
            return {"error": f"transfer {tid} failed: {result}"}
        time.sleep(0.0005)
    return {"error": f"transfer {tid} not done after 20 s"}


def reply(obj: dict) -> None:
    PROTO.write(json.dumps(obj) + "\n")
    PROTO.flush()


if __name__ == "__main__":
    main()

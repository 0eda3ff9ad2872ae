"""PeerKVTier from the installed wheel inside vLLM's real
TieringOffloadingManager, in two spawned processes (tests/python/peerkv_node):
a prefiller stores rows, the decoder's tier pulls them (PD), byte for byte.

Run with a venv holding the wheel and seeing vLLM (tests/wheel/test_wheel.py
adds the test venv's site-packages after its own). Prints one JSON line.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))  # peerkv_node, vllm_compat only

import peerkv  # noqa: E402
from peerkv_node import NodeProcess, control_port, kv_transfer_config, new_kv_id, random_keys, random_rows  # noqa: E402


def main() -> int:
    a, b = NodeProcess(startup_timeout=300), NodeProcess(startup_timeout=300)
    try:
        a.ready(), b.ready()
        infos = [a.call("add", "a", kv_transfer_config(control_port()), timeout=120)]
        port_a = control_port()
        infos.append(a.call("add", "a_pd", kv_transfer_config(port_a), timeout=120))
        infos.append(b.call("add", "b", kv_transfer_config(control_port()), timeout=120))
        keys, rows, kid = random_keys(4), random_rows(4), new_kv_id()
        params = {"remote_decoder": {"kv_request_id": kid}}
        a.call("start", "a_pd", "p-1", params)
        assert a.call("store", "a_pd", "p-1", params, keys, rows) == 4
        a.call("finish", "a_pd", "p-1")
        source = {"remote_prefiller": {"kv_request_id": kid, "remote_host": "127.0.0.1", "remote_port": port_a}}
        got = b.call("pull", "b", "d-1", source, keys, 30.0, timeout=90)
        assert got["results"] == ["HIT"] * 4, got["results"]
        assert got["rows"] == rows, "rows differ"
        b.call("finish", "b", "d-1")
        stats = b.call("stats", "b")
        print(json.dumps({"peerkv": peerkv.__file__, "library": str(peerkv.library_path()), "tiers": infos,
                          "rows": len(rows), "data_paths": stats.get("data_paths")}))
        return 0
    finally:
        a.close()
        b.close()


if __name__ == "__main__":
    sys.exit(main())

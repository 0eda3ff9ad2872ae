"""vLLM's typed router hints drive a pull: a request whose ReqContext.kv_hints
carries a kv.fetch 1.x action pulls the blocks it lists from the source it
names, inside vLLM's real TieringOffloadingManager (one node hosting a source
engine and a consumer engine). Everything else in a hint is ignored or
refused, counted by reason, and the request goes on without a pull."""

import pytest
from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash
from vllm.v1.kv_offload.base import get_offload_block_hash

from peerkv_node import (
    PRIMARY_BYTES,
    ROW_BYTES,
    NodeProcess,
    control_port,
    kv_transfer_config,
    new_kv_id,
    random_keys,
    random_rows,
)

HOST = "127.0.0.1"
PULL_TIMEOUT_S = 20.0
REGION_ROWS = PRIMARY_BYTES // ROW_BYTES


@pytest.fixture(scope="module")
def engines(library):
    node = NodeProcess()
    try:
        node.ready()
        ports = {}
        for name in ("src", "dst"):
            ports[name] = control_port()
            node.call("add", name, kv_transfer_config(ports[name]), timeout=60)
        node.ports = ports
        node.source_url = f"tcp://{HOST}:{ports['src']}"
        yield node
    finally:
        node.close()


def published(key: bytes) -> int:
    """The integer vLLM publishes for a key's block in its KV events, which
    is what a router lists in block_hashes."""
    block = maybe_convert_block_hash(get_offload_block_hash(key))
    assert isinstance(block, int)
    return block


def fetch(url: str, blocks: list[int], version: str = "1.0", action_id: str = "a-1", **payload) -> dict:
    payload = {"source_control_endpoint": url, "block_hashes": blocks, **payload}
    return {"action_id": action_id, "action_type": "kv.fetch", "action_version": version, "payload": payload}


def envelope(*actions) -> dict:
    return {"protocol_version": "0.1", "message_id": new_kv_id(), "actions": list(actions)}


def held_by_source(engines, n: int):
    keys, rows = random_keys(n), random_rows(n)
    src_req = new_kv_id()
    assert engines.call("store", "src", src_req, None, keys, rows) == n
    return keys, rows, src_req


def pull(engines, req_id: str, keys, params=None, hints=None):
    engines.call("start", "dst", req_id, params, hints)
    got = engines.call("pull", "dst", req_id, params, keys, PULL_TIMEOUT_S)
    engines.call("finish", "dst", req_id)
    return got


def counters(engines) -> dict:
    """The consumer's metric deltas since the last call (get_stats)."""
    return engines.call("metrics", "dst")


def ignored(metrics: dict, reason: str) -> float:
    return metrics.get(f"vllm:peerkv_kv_hints_ignored:('{reason}',)", 0)


def test_a_kv_fetch_hint_pulls_its_blocks_from_the_source_it_names(engines):
    keys, rows, src_req = held_by_source(engines, 4)
    counters(engines)
    got = pull(engines, "h-all", keys, hints=envelope(fetch(engines.source_url, [published(k) for k in keys])))
    assert got["results"] == ["HIT"] * 4
    assert got["rows"] == rows  # byte for byte, from the source's primary tier
    metrics = counters(engines)
    assert metrics.get("vllm:peerkv_kv_hint_pulls") == 1, metrics
    assert metrics.get("vllm:peerkv_kv_ids_minted") == 1, metrics  # as an id-less remote_kv_source
    assert metrics.get("vllm:peerkv_bytes_received", 0) >= 4 * ROW_BYTES, metrics
    assert not any(k.startswith("vllm:peerkv_kv_hints_ignored") for k in metrics), metrics
    engines.call("finish", "src", src_req)


def test_only_keys_on_the_block_list_are_asked_of_the_source(engines):
    """The source holds all four blocks; the hint lists the first two (and
    one block the request does not have): those two are pulled, the other
    keys are never asked of the source, and the stray block is counted."""
    keys, rows, src_req = held_by_source(engines, 4)
    counters(engines)
    listed = [published(keys[1]), published(keys[0]), published(random_keys(1)[0])]  # membership, not order
    got = pull(engines, "h-part", keys, hints=envelope(fetch(engines.source_url, listed)))
    assert got["results"] == ["HIT", "HIT", "MISS", "MISS"]
    assert got["rows"][:2] == rows[:2]
    metrics = counters(engines)
    assert metrics.get("vllm:peerkv_lookup_hits") == 2, metrics
    assert metrics.get("vllm:peerkv_lookup_misses", 0) == 0, metrics  # keys 2 and 3 were not asked
    assert metrics.get("vllm:peerkv_kv_hint_blocks_unmatched") == 1, metrics
    engines.call("finish", "src", src_req)


def test_unknown_actions_and_major_versions_are_ignored_and_counted(engines):
    keys, rows, src_req = held_by_source(engines, 2)
    blocks = [published(k) for k in keys]
    counters(engines)
    engines.call("take_logs")
    got = pull(engines, "h-v2", keys, hints=envelope(fetch(engines.source_url, blocks, version="2.0")))
    assert got["results"] == ["MISS"] * 2  # a major version peerkv does not read: no pull
    mixed = envelope(
        {"action_id": "x", "action_type": "kv.evict", "action_version": "1.0", "payload": {}},
        fetch(engines.source_url, blocks, version="2.0", action_id="v2"),
        fetch(engines.source_url, blocks, version="1.3", action_id="v13"),  # a later minor: read
        fetch(engines.source_url, blocks, action_id="second"),
    )
    got = pull(engines, "h-mixed", keys, hints=mixed)
    assert got["results"] == ["HIT"] * 2 and got["rows"] == rows
    metrics = counters(engines)
    assert ignored(metrics, "unknown_version") == 2, metrics
    assert ignored(metrics, "unknown_action") == 1, metrics
    assert ignored(metrics, "extra_fetch") == 1, metrics
    assert metrics.get("vllm:peerkv_kv_hint_pulls") == 1, metrics
    logs = "\n".join(engines.call("take_logs"))
    assert "kv_hints action ignored (unknown_action): action_type 'kv.evict'" in logs
    assert "kv_hints action ignored (unknown_version): kv.fetch version '2.0'; peerkv reads 1.x" in logs
    engines.call("finish", "src", src_req)


def test_kv_transfer_params_that_name_a_source_win_over_a_hint(engines):
    keys, rows, src_req = held_by_source(engines, 2)
    counters(engines)
    params = {"remote_kv_source": {"kv_request_id": new_kv_id(), "remote_host": HOST, "remote_port": engines.ports["src"]}}
    nowhere = f"tcp://{HOST}:{control_port()}"  # nobody listens: pulling from it would miss
    got = pull(engines, "h-both", keys, params, envelope(fetch(nowhere, [published(k) for k in keys])))
    assert got["results"] == ["HIT"] * 2 and got["rows"] == rows
    metrics = counters(engines)
    assert ignored(metrics, "kv_transfer_params") == 1, metrics
    assert metrics.get("vllm:peerkv_kv_hint_pulls", 0) == 0, metrics
    engines.call("finish", "src", src_req)


def test_a_hint_adds_its_source_to_kv_transfer_params_that_name_none(engines):
    """A prefill leg (remote_decoder) whose router also hints where its prefix
    is cached: the request keeps its role and pulls the prefix."""
    keys, rows, src_req = held_by_source(engines, 2)
    params = {"remote_decoder": {"kv_request_id": new_kv_id()}}
    hints = envelope(fetch(engines.source_url, [published(k) for k in keys]))
    assert engines.call("start", "dst", "h-pf", params, hints) == "request_level"
    got = engines.call("pull", "dst", "h-pf", params, keys, PULL_TIMEOUT_S)
    assert got["results"] == ["HIT"] * 2 and got["rows"] == rows
    engines.call("finish", "dst", "h-pf")
    engines.call("finish", "src", src_req)


BAD_HINTS = {
    "scheme the URL parser refuses": ("udp://127.0.0.1:1", None, {}, "bad_source", "kv.fetch 'a-1': source_control_endpoint: unknown scheme \"udp\"; the only control"),
    "URL without a port": ("tcp://127.0.0.1", None, {}, "bad_source", "the port is missing"),
    "URL with a path": ("tcp://127.0.0.1:1/x", None, {}, "bad_source", "a path, query or fragment is reserved"),
    "endpoint not a string": (5710, None, {}, "bad_payload", "source_control_endpoint must be a URL string"),
    "endpoint too long": ("tcp://" + "a" * 600 + ":1", None, {}, "bad_payload", "longer than 512 bytes"),
    "no blocks": (None, [], {}, "bad_payload", "block_hashes must be a non-empty list"),
    "negative block": (None, [-1], {}, "bad_payload", "block_hashes[0] must be an integer in 0..2^64-1"),
    "block past 64 bits": (None, [1 << 64], {}, "bad_payload", "block_hashes[0] must be an integer"),
    "boolean block": (None, [True], {}, "bad_payload", "got True"),
    "block as a string": (None, ["12"], {}, "bad_payload", "got '12'"),
    "more blocks than the region has rows": (
        None, list(range(REGION_ROWS + 1)), {}, "bad_payload", f"this engine's CPU tier holds {REGION_ROWS} rows",
    ),
    "unknown mode": (None, None, {"mode": "teleport"}, "bad_payload", "mode must be copy or move"),
    "no_retain not a boolean": (None, None, {"no_retain": "yes"}, "bad_payload", "no_retain must be a boolean"),
}


@pytest.mark.parametrize("case", BAD_HINTS)
def test_a_bad_kv_fetch_is_refused_counted_and_the_request_computes(engines, case):
    url, blocks, extra, reason, message = BAD_HINTS[case]
    keys, _, src_req = held_by_source(engines, 2)  # accepted, this hint would pull them
    counters(engines)
    engines.call("take_logs")
    hint = fetch(engines.source_url if url is None else url, [published(k) for k in keys] if blocks is None else blocks, **extra)
    got = pull(engines, "h-bad", keys, hints=envelope(hint))
    assert got["results"] == ["MISS"] * 2
    metrics = counters(engines)
    assert ignored(metrics, reason) == 1, metrics
    assert metrics.get("vllm:peerkv_kv_hint_pulls", 0) == 0, metrics
    assert metrics.get("vllm:peerkv_lookup_hits", 0) == 0, metrics
    logs = [line for line in engines.call("take_logs") if "kv_hints of request h-bad not used" in line]
    assert len(logs) == 1 and logs[0].startswith("WARNING") and f"({reason})" in logs[0] and message in logs[0], logs
    engines.call("finish", "src", src_req)


@pytest.mark.parametrize(
    "hints",
    [
        {"protocol_version": "0.1", "message_id": "m", "actions": "kv.fetch"},
        {"protocol_version": "0.1", "message_id": "m", "actions": [fetch("tcp://127.0.0.1:1", [1])] * 17},
        "not an envelope",
        {"protocol_version": "0.1", "message_id": "m", "actions": ["not an action"]},
    ],
    ids=["actions not a list", "too many actions", "not an envelope", "action not an action"],
)
def test_a_malformed_envelope_is_refused_and_the_request_computes(engines, hints):
    keys, _, src_req = held_by_source(engines, 1)
    counters(engines)
    assert pull(engines, "h-env", keys, hints=hints)["results"] == ["MISS"]
    metrics = counters(engines)
    refused = ignored(metrics, "bad_envelope") + ignored(metrics, "unknown_action")
    assert refused == 1, metrics
    engines.call("finish", "src", src_req)


def test_a_refused_hint_leaves_the_requests_own_kv_transfer_params_in_force(engines):
    kid = new_kv_id()
    hints = envelope(fetch("udp://127.0.0.1:1", [1]))
    assert engines.call("start", "dst", "h-keep", {"remote_decoder": {"kv_request_id": kid}}, hints) == "request_level"
    engines.call("finish", "dst", "h-keep")
    metrics = counters(engines)
    assert ignored(metrics, "bad_source") == 1, metrics

"""One prompt pulled from several sources (remote_kv_source as a list), one of
them stock vLLM's "p2p" tier (the installed release), next to a peerkv
producer; the consumer is a PeerKVTier.

Processes: V runs vLLM's p2p tier (a producer that sees ordinary lookups and
fetches from its own session), P runs a PeerKVTier producer, C the PeerKVTier
consumer. NIXL carries V's rows, the same-host copy P's. Each producer's rows
are its own random bytes unless the test gives both the same, so the
consumer's rows show byte for byte where every key came from.
"""

import pytest

from interop_node import InteropNode
from peerkv_node import FAST_TIMEOUTS, ROW_BYTES, control_port, new_kv_id, random_keys, random_rows, wait_until
from test_mixed_cluster import HOST, PEERKV, PULL_TIMEOUT_S, VLLM, Cluster, _rid


@pytest.fixture(scope="module")
def cluster(library):
    processes = {"V": InteropNode(), "P": InteropNode(), "C": InteropNode()}
    try:
        for process in processes.values():
            process.ready()
        c = Cluster(processes)
        c.add("V", "v", VLLM)
        c.add("P", "p", PEERKV)
        c.add("C", "c", PEERKV)
        yield c
    finally:
        for process in processes.values():
            process.close()


def _url(cluster, name):
    return f"tcp://{HOST}:{cluster.ports[name]}"


def _hold(cluster, name, keys, rows):
    node = cluster.nodes[name]
    req = _rid(f"hold-{name}")
    assert node.call("store", name, req, None, keys, rows) == len(keys)
    node.call("finish", name, req)


def _pull(cluster, req, sources, keys):
    c = cluster.nodes["c"]
    got = c.call("pull", "c", req, {"remote_kv_source": sources}, keys, PULL_TIMEOUT_S)
    c.call("finish", "c", req)
    return got


def test_stock_vllm_and_peerkv_hold_halves_of_one_prompt(cluster):
    """Disjoint: V holds the first 20 keys, P the next 20; the prefix is all 40."""
    keys = random_keys(40)
    v_rows, p_rows = random_rows(20), random_rows(20)
    _hold(cluster, "v", keys[:20], v_rows)
    _hold(cluster, "p", keys[20:], p_rows)
    sent, received = cluster.peerkv_bytes("p", "bytes_out"), cluster.peerkv_bytes("c", "bytes_in")
    sources = [
        {"kv_request_id": new_kv_id(), "remote_host": HOST, "remote_port": cluster.ports["v"]},
        _url(cluster, "p"),  # no kv_request_id: the consumer mints one
    ]
    got = _pull(cluster, _rid("halves"), sources, keys)
    assert got["results"] == ["HIT"] * 40
    assert got["rows"] == v_rows + p_rows
    assert cluster.peerkv_bytes("p", "bytes_out") - sent == 20 * ROW_BYTES
    assert cluster.peerkv_bytes("c", "bytes_in") - received == 40 * ROW_BYTES


def test_overlapping_holdings_with_a_stock_vllm_source(cluster):
    """V holds keys 0-29, P 10-39 (the same bytes where both hold a key):
    0-9 can only come from V, 30-39 only from P, the rest from either."""
    keys, rows = random_keys(40), random_rows(40)
    _hold(cluster, "v", keys[:30], rows[:30])
    _hold(cluster, "p", keys[10:], rows[10:])
    sent, received = cluster.peerkv_bytes("p", "bytes_out"), cluster.peerkv_bytes("c", "bytes_in")
    got = _pull(cluster, _rid("overlap"), [_url(cluster, "v"), {"remote_url": _url(cluster, "p")}], keys)
    assert got["results"] == ["HIT"] * 40
    assert got["rows"] == rows
    from_p = cluster.peerkv_bytes("p", "bytes_out") - sent
    assert 10 * ROW_BYTES <= from_p <= 30 * ROW_BYTES, from_p
    assert cluster.peerkv_bytes("c", "bytes_in") - received == 40 * ROW_BYTES, "each key came from one source"


def test_a_gap_ends_the_prefix_across_sources(cluster):
    """Key 10 is held by nobody: keys after it are recomputed even though P holds them."""
    keys = random_keys(20)
    v_rows, p_rows = random_rows(10), random_rows(9)
    _hold(cluster, "v", keys[:10], v_rows)
    _hold(cluster, "p", keys[11:], p_rows)
    got = _pull(cluster, _rid("gap"), [_url(cluster, "p"), _url(cluster, "v")], keys)
    assert got["results"] == ["HIT"] * 10 + ["MISS"] * 10
    assert got["rows"] == v_rows + [None] * 10


def test_stock_vllm_serves_when_the_first_source_is_down(cluster):
    """The orchestrator's first choice listens nowhere; V serves the prompt."""
    keys, rows = random_keys(8), random_rows(8)
    _hold(cluster, "v", keys, rows)
    got = _pull(cluster, _rid("down"), [f"tcp://{HOST}:{control_port()}", _url(cluster, "v")], keys)
    assert got["results"] == ["HIT"] * 8
    assert got["rows"] == rows
    assert got["elapsed"] < 5.0, "a source that never answers does not hold back keys another one has"
    assert cluster.nodes["c"].call("stats", "c")["jobs_unreported"] == 0


@pytest.mark.parametrize("unused", ["v", "p"])
def test_a_source_the_load_did_not_use_is_released_before_the_request_ends(cluster, unused):
    """Both hold the same 8 keys, and a prefix this short comes from the
    first source alone. The other answered HIT and pinned its rows; every key
    it has landed, so they are released then (its engine stops stepping for
    them), not when the request ends or the producer's store timeout passes."""
    keys, rows = random_keys(8), random_rows(8)
    _hold(cluster, "v", keys, rows)
    _hold(cluster, "p", keys, rows)
    first = "p" if unused == "v" else "v"
    c, req = cluster.nodes["c"], _rid("unused")
    params = {"remote_kv_source": [_url(cluster, first), _url(cluster, unused)]}
    node = cluster.nodes[unused]
    try:
        c.call("ask", "c", req, params, keys)
        assert wait_until(lambda: node.call("jobs_in_flight", unused) == 1, timeout_s=PULL_TIMEOUT_S), (
            f"{unused} never pinned the rows it was asked for")
        got = c.call("pull", "c", req, params, keys, PULL_TIMEOUT_S)
        assert got["results"] == ["HIT"] * 8
        assert got["rows"] == rows
        assert wait_until(lambda: node.call("jobs_in_flight", unused) == 0,
                          timeout_s=FAST_TIMEOUTS["store_timeout_s"] / 2), (
            f"{unused} still pins rows for a request whose load came from {first}")
    finally:
        c.call("finish", "c", req)

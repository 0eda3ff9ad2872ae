"""peerkv's PeerKVTier and stock vLLM's "p2p" tier (the installed release,
0.33.x or 0.32.x: run it under each venv) in one cluster.

Every engine is a spawned process hosting real TieringOffloadingManagers with
the same model config (block length, fingerprint, hash seed), driven step by
step like vLLM's scheduler. NIXL (UCX over loopback) carries the rows: the
producer's primary rows are random bytes, and the consumer's primary rows must
equal them byte for byte once the load job has succeeded (lookup HIT means the
secondary tier's load job finished into the primary tier).

Processes: V runs vLLM's p2p tier, P runs PeerKVTier with its default
data_transport ("auto": same-host copy, NIXL, TCP; NIXL is what vLLM peers
get), Q runs PeerKVTier with data_transport "nixl" so that peerkv <-> peerkv
links are NIXL too; X (PeerKVTier) and Y (vLLM's tier) run under a
different PYTHONHASHSEED.
"""

import time
import uuid

import pytest

from interop_node import (
    OTHER_HASH_SEED,
    InteropNode,
    peerkv_config,
    vllm_p2p_config,
)
from peerkv_node import FAST_TIMEOUTS, ROW_BYTES, control_port, new_kv_id, random_keys, random_rows

HOST = "127.0.0.1"
PULL_TIMEOUT_S = 20.0
# A failed pull ends within handshake + load + abort-ack deadlines (both
# implementations run with the same short deadlines here).
FAILURE_DEADLINE_S = (
    FAST_TIMEOUTS["handshake_timeout_s"]
    + FAST_TIMEOUTS["load_timeout_s"]
    + FAST_TIMEOUTS["abort_ack_timeout_s"]
    + 3.0
)

VLLM, PEERKV = "p2p", "PeerKVTier"


class Cluster:
    def __init__(self, processes):
        self.processes = processes
        self.nodes, self.ports, self.kinds = {}, {}, {}

    def add(self, process, name, kind, data_transport=None):
        port = control_port()
        config = vllm_p2p_config(port) if kind == VLLM else peerkv_config(port, data_transport)
        node = self.processes[process]
        node.call("take_logs")
        info = node.call("add", name, config, timeout=60)
        assert info["tier_type"] == kind, info
        if kind == PEERKV:  # NIXL really loaded: the default serves it beside shm and tcp
            paths = {"nixl": "nixl", "tcp": "tcp"}.get(data_transport, "shm+nixl+tcp")
            lines = node.call("take_logs")
            assert any(f"127.0.0.1:{port}:" in line and f"data paths {paths}" in line for line in lines), lines
        self.nodes[name], self.ports[name] = node, port
        self.kinds[name] = kind

    def peerkv_bytes(self, name, field):
        """bytes_in / bytes_out of a PeerKVTier's data path; None for vLLM's tier."""
        if self.kinds[name] != PEERKV:
            return None
        return self.nodes[name].call("stats", name)[field]

    def source(self, role, name, kid):
        return {role: {"kv_request_id": kid, "remote_host": HOST, "remote_port": self.ports[name]}}


@pytest.fixture(scope="module")
def cluster(library):
    processes = {
        "V": InteropNode(),
        "P": InteropNode(),
        "Q": InteropNode(),
        "X": InteropNode(hash_seed=OTHER_HASH_SEED),
        "Y": InteropNode(hash_seed=OTHER_HASH_SEED),
    }
    try:
        for process in processes.values():
            process.ready()
        c = Cluster(processes)
        c.add("V", "v", VLLM)
        c.add("V", "v_dec", VLLM)
        c.add("P", "p", PEERKV)
        c.add("P", "p_dec", PEERKV)
        # Q serves NIXL only, so the peerkv <-> peerkv pairs below (all
        # involve q) are NIXL links rather than the same-host copy.
        c.add("Q", "q", PEERKV, data_transport="nixl")
        c.add("X", "x", PEERKV)
        c.add("X", "x_tcp", PEERKV, data_transport="tcp")
        c.add("Y", "y", VLLM)
        yield c
    finally:
        for process in processes.values():
            process.close()


def _rid(prefix):
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_peerkv_pair_uses_nixl(cluster):
    """p (default paths) and q (NIXL only) meet on NIXL, logged on both sides."""
    p, q = cluster.nodes["p"], cluster.nodes["q"]
    _logs(p, q)
    req = _rid("path-probe")
    got = q.call("pull", "q", req, cluster.source("remote_kv_source", "p", new_kv_id()), random_keys(1), PULL_TIMEOUT_S)
    q.call("finish", "q", req)
    assert got["results"] == ["MISS"]
    lines = _logs(p, q)
    for name in ("p", "q"):
        assert any(f"peer {HOST}:{cluster.ports[name]}: data path nixl" in line for line in lines), (name, lines)


# (producer, consumer): peerkv as consumer, as producer, and peerkv <-> peerkv.
PAIRS = [
    pytest.param("v", "p", id="vllm->peerkv"),
    pytest.param("p", "v", id="peerkv->vllm"),
    pytest.param("p", "q", id="peerkv->peerkv"),
]


@pytest.mark.parametrize("producer,consumer", PAIRS)
def test_pd_prefiller_first(cluster, producer, consumer):
    prod, cons = cluster.nodes[producer], cluster.nodes[consumer]
    keys, rows, kid = random_keys(4), random_rows(4), new_kv_id()
    sent_before = cluster.peerkv_bytes(producer, "bytes_out")
    received_before = cluster.peerkv_bytes(consumer, "bytes_in")
    params = {"remote_decoder": {"kv_request_id": kid}}
    req = _rid("pf-prefill")
    assert prod.call("store", producer, req, params, keys, rows) == 4
    prod.call("finish", producer, req)
    dec = _rid("pf-decode")
    got = cons.call("pull", consumer, dec, cluster.source("remote_prefiller", producer, kid), keys, PULL_TIMEOUT_S)
    cons.call("finish", consumer, dec)
    assert got["results"] == ["HIT"] * 4
    assert got["rows"] == rows
    # peerkv's side of the pair counted the rows on its NIXL data path.
    if sent_before is not None:
        assert cluster.peerkv_bytes(producer, "bytes_out") - sent_before == 4 * ROW_BYTES
    if received_before is not None:
        assert cluster.peerkv_bytes(consumer, "bytes_in") - received_before == 4 * ROW_BYTES


@pytest.mark.parametrize("producer,consumer", PAIRS)
def test_pd_decoder_first(cluster, producer, consumer):
    prod, cons = cluster.nodes[producer], cluster.nodes[consumer]
    keys, rows, kid = random_keys(3), random_rows(3), new_kv_id()
    dec = _rid("df-decode")
    cons.submit("pull", consumer, dec, cluster.source("remote_prefiller", producer, kid), keys, PULL_TIMEOUT_S)
    time.sleep(0.5)  # the decoder's handshake and fetch reach the prefiller first
    params = {"remote_decoder": {"kv_request_id": kid}}
    req = _rid("df-prefill")
    assert prod.call("store", producer, req, params, keys, rows) == 3
    prod.call("finish", producer, req)
    got = cons.result("pull", PULL_TIMEOUT_S + 10)
    cons.call("finish", consumer, dec)
    assert got["results"] == ["HIT"] * 3
    assert got["rows"] == rows


@pytest.mark.parametrize("producer,consumer", PAIRS)
def test_p2p_partial_hits(cluster, producer, consumer):
    prod, cons = cluster.nodes[producer], cluster.nodes[consumer]
    keys, rows = random_keys(5), random_rows(3)
    src = _rid("partial-src")
    assert prod.call("store", producer, src, None, keys[:3], rows) == 3
    prod.call("finish", producer, src)
    req = _rid("partial")
    got = cons.call("pull", consumer, req, cluster.source("remote_kv_source", producer, new_kv_id()), keys, PULL_TIMEOUT_S)
    cons.call("finish", consumer, req)
    assert got["results"] == ["HIT"] * 3 + ["MISS"] * 2
    assert got["rows"] == rows + [None, None]


# (source, prefiller, decoder): the prefiller pulls a prefix from the source,
# computes the rest, and serves all of it to a decoder that saw neither.
CHAINS = [
    pytest.param("v", "p", "v_dec", id="vllm->peerkv->vllm"),
    pytest.param("p", "v", "p_dec", id="peerkv->vllm->peerkv"),
    pytest.param("p", "q", "p_dec", id="peerkv->peerkv->peerkv"),
]


@pytest.mark.parametrize("source,prefiller,decoder", CHAINS)
def test_remote_decoder_with_remote_kv_source(cluster, source, prefiller, decoder):
    src, pre, dec = cluster.nodes[source], cluster.nodes[prefiller], cluster.nodes[decoder]
    prefix, prefix_rows = random_keys(2), random_rows(2)
    new, new_rows = random_keys(2), random_rows(2)
    src_req = _rid("chain-src")
    src.call("store", source, src_req, None, prefix, prefix_rows)
    src.call("finish", source, src_req)

    decode_kid = new_kv_id()
    params = {"remote_decoder": {"kv_request_id": decode_kid}}
    params.update(cluster.source("remote_kv_source", source, new_kv_id()))
    pre_req = _rid("chain-prefill")
    got = pre.call("pull", prefiller, pre_req, params, prefix, PULL_TIMEOUT_S)
    assert got["results"] == ["HIT", "HIT"]
    assert got["rows"] == prefix_rows
    pre.call("store", prefiller, pre_req, params, prefix + new, prefix_rows + new_rows)
    pre.call("finish", prefiller, pre_req)

    dec_req = _rid("chain-decode")
    got = dec.call(
        "pull", decoder, dec_req, cluster.source("remote_prefiller", prefiller, decode_kid), prefix + new, PULL_TIMEOUT_S
    )
    dec.call("finish", decoder, dec_req)
    # The logs of every process involved, only on failure: the cause may be
    # on either side (a stock decoder that could not open its session logs why).
    assert got["results"] == ["HIT"] * 4, _shown(_logs(*{id(n): n for n in (src, pre, dec)}.values()))
    assert got["rows"] == prefix_rows + new_rows


def _logs(*nodes):
    return [line for node in nodes for line in node.call("take_logs")]


def _shown(lines):
    """Log lines as an assertion message pytest prints whole (it truncates a list's repr)."""
    return "\n".join(["logs:", *lines])


# Odd-seed engines (PYTHONHASHSEED differs) and the compatible engine of the
# same kind that replaces each one for the "still healthy" check.
COMPATIBLE_TWIN = {"x": "p", "y": "v"}
SEED_MISMATCHES = [
    pytest.param("x", "v", id="peerkv(seed B)->vllm"),
    pytest.param("v", "x", id="vllm->peerkv(seed B)"),
    pytest.param("y", "p", id="vllm(seed B)->peerkv"),
    pytest.param("p", "y", id="peerkv->vllm(seed B)"),
]


def _pull_across_refusal(cluster, producer, consumer):
    """A P2P pull of two keys the producer holds, between peers whose
    handshake fails; returns the pull and the log lines of both sides."""
    prod, cons = cluster.nodes[producer], cluster.nodes[consumer]
    keys, rows = random_keys(2), random_rows(2)
    src = _rid("refused-src")
    prod.call("store", producer, src, None, keys, rows)
    _logs(prod, cons)
    req = _rid("refused")
    got = cons.call("pull", consumer, req, cluster.source("remote_kv_source", producer, new_kv_id()), keys, PULL_TIMEOUT_S)
    cons.call("finish", consumer, req)
    prod.call("finish", producer, src)
    return got, _logs(prod, cons)


@pytest.mark.parametrize("producer,consumer", SEED_MISMATCHES)
def test_hash_seed_mismatch_is_rejected_and_both_sides_stay_healthy(cluster, producer, consumer):
    got, lines = _pull_across_refusal(cluster, producer, consumer)
    assert got["results"] == ["MISS", "MISS"]
    assert got["elapsed"] < FAILURE_DEADLINE_S
    assert any("hash seed mismatch" in line for line in lines), f"no log line names the seed mismatch: {lines}"

    # Both sides still serve compatible peers, in the same direction.
    test_p2p_partial_hits(cluster, COMPATIBLE_TWIN.get(producer, producer), COMPATIBLE_TWIN.get(consumer, consumer))
    # And the odd-seed engine still works locally: its store path and its tier answer.
    odd = producer if producer in COMPATIBLE_TWIN else consumer
    node = cluster.nodes[odd]
    own = _rid("seed-local")
    assert node.call("store", odd, own, None, random_keys(2), random_rows(2), timeout=10) == 2
    node.call("finish", odd, own, timeout=10)
    if cluster.kinds[odd] == PEERKV:
        assert node.call("stats", odd, timeout=10)["jobs_unreported"] == 0


# Stock vLLM <-> vLLM: both sides send their Connect at once and each checks
# the other's, so the dialing consumer rejects the producer's Connect and
# falls back at once, long before the handshake timeout.
FAIL_FAST_S = 1.0
REFUSAL_SETTLE_S = 1.0


def _assert_refusals_ended(cluster, producer, consumer):
    """The refusal is over: a stock peer opens a session (and sends a connect)
    for any frame from a peer it holds none with, so a goodbye for every
    refusal kept two peers that refuse each other trading them for good."""
    time.sleep(REFUSAL_SETTLE_S)
    later = [line for line in _logs(cluster.nodes[producer], cluster.nodes[consumer]) if "rejecting peer" in line]
    assert len(later) <= 2, _shown(["refusals went on after the pull:", *later])


@pytest.mark.parametrize(
    "producer,consumer",
    [
        pytest.param("y", "v", id="vllm(seed B)->vllm"),
        pytest.param("y", "p", id="vllm(seed B)->peerkv"),
        pytest.param("x", "v", id="peerkv(seed B)->vllm"),
        pytest.param("x", "p", id="peerkv(seed B)->peerkv"),
    ],
)
def test_seed_mismatch_falls_back_before_the_handshake_timeout(cluster, producer, consumer):
    got, lines = _pull_across_refusal(cluster, producer, consumer)
    assert got["results"] == ["MISS", "MISS"]
    assert got["elapsed"] < FAIL_FAST_S, _shown([f"elapsed {got['elapsed']:.2f} s", *lines])
    _assert_refusals_ended(cluster, producer, consumer)


# A PeerKVTier that serves TCP only has no data path in common with vLLM's
# tier (NIXL only): the handshake is refused with a message naming that, and
# requests fall back at once instead of waiting for a deadline. x_tcp runs in
# process X with the other hash seed, so y (same seed) is the vLLM peer.
@pytest.mark.parametrize(
    "producer,consumer", [pytest.param("x_tcp", "y", id="peerkv(tcp)->vllm"), pytest.param("y", "x_tcp", id="vllm->peerkv(tcp)")]
)
def test_no_shared_data_path_is_refused_and_named(cluster, producer, consumer):
    got, lines = _pull_across_refusal(cluster, producer, consumer)
    assert got["results"] == ["MISS", "MISS"]
    assert got["elapsed"] < FAIL_FAST_S, _shown([f"elapsed {got['elapsed']:.2f} s", *lines])
    _assert_refusals_ended(cluster, producer, consumer)
    assert any("no data path shared with peer" in line and "offers no tcp path" in line for line in lines), lines

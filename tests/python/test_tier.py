"""PeerKVTier inside vLLM's real TieringOffloadingManager, two or three engines
in separate spawned processes, driven step by step like vLLM's scheduler.

Rows written into a producer's primary tier must appear byte for byte in the
consumer's primary tier; every failure path must end in MISS (local
recompute) within its deadline, with the reason logged.
"""

import time

import pytest

from peerkv_node import (
    FAST_TIMEOUTS,
    ROW_BYTES,
    NodeError,
    NodeProcess,
    control_port,
    kv_transfer_config,
    new_kv_id,
    random_keys,
    random_rows,
    wait_until,
)
from vllm_compat import HAS_TIER_POLL_THREAD

HOST = "127.0.0.1"
# A failed pull must end within handshake + lookup/load + abort-ack deadlines.
FAILURE_DEADLINE_S = (
    FAST_TIMEOUTS["handshake_timeout_s"]
    + FAST_TIMEOUTS["load_timeout_s"]
    + FAST_TIMEOUTS["abort_ack_timeout_s"]
    + 3.0
)
PULL_TIMEOUT_S = 20.0


class Cluster:
    def __init__(self):
        self.ports = {}
        self.nodes = {}

    def add(self, node, name, spec_options=None, **tier_options):
        port = control_port()
        config = kv_transfer_config(port, **tier_options)
        config["kv_connector_extra_config"].update(spec_options or {})
        info = node.call("add", name, config, timeout=60)
        assert info == {"tier_class": "PeerKVTier", "tier_type": "PeerKVTier"}
        self.ports[name] = port
        self.nodes[name] = node
        return port

    def source(self, key, name, kid):
        return {key: {"kv_request_id": kid, "remote_host": HOST, "remote_port": self.ports[name]}}


@pytest.fixture(scope="module")
def cluster(library):
    a, b = NodeProcess(), NodeProcess()
    try:
        a.ready(), b.ready()
        c = Cluster()
        c.a, c.b = a, b
        c.add(a, "a")
        c.add(a, "a_dec")
        c.add(b, "b")
        c.add(b, "b_fp", config_fingerprint="0123456789abcdef")
        c.add(b, "b_seed", hash_seed="some-other-seed")
        c.add(b, "b_tcp", data_transport="tcp")
        yield c
    finally:
        a.close()
        b.close()


_GAUGES = ("vllm:peerkv_peer_up", "vllm:peerkv_peer_session_age_seconds", "vllm:peerkv_peer_last_lookup_rtt_seconds",
           "vllm:peerkv_peer_rtt_", "vllm:peerkv_peer_setup_", "vllm:peerkv_peer_pull_", "vllm:peerkv_peer_throughput_")


def _metrics_until(node, name, seen, key, timeout_s=5.0):
    """seen plus further metrics calls until key appears: counters (deltas)
    summed, the per-peer gauges the latest value."""
    total = dict(seen)

    def more():
        for k, v in node.call("metrics", name).items():
            total[k] = v if k.startswith(_GAUGES) else total.get(k, 0) + v
        return key in total

    assert key in total or wait_until(more, timeout_s), total
    return total


def _logs(*nodes):
    return [line for node in nodes for line in node.call("take_logs")]


def test_pd_prefiller_first(cluster):
    a, b = cluster.a, cluster.b
    keys, rows, kid = random_keys(4), random_rows(4), new_kv_id()
    params = {"remote_decoder": {"kv_request_id": kid}}
    assert a.call("start", "a", "p-pf", params) == "request_level"
    assert a.call("store", "a", "p-pf", params, keys, rows) == 4
    a.call("finish", "a", "p-pf")
    got = b.call("pull", "b", "d-pf", cluster.source("remote_prefiller", "a", kid), keys, PULL_TIMEOUT_S)
    assert got["results"] == ["HIT"] * 4
    assert got["rows"] == rows
    b.call("finish", "b", "d-pf")
    metrics = b.call("metrics", "b")
    assert metrics.get("vllm:peerkv_bytes_received", 0) >= 4 * ROW_BYTES
    # Per data path (same-host copy between these two), and timed.
    assert metrics.get("vllm:peerkv_data_path_bytes_received:('shm',)", 0) >= 4 * ROW_BYTES, metrics
    assert metrics.get("vllm:peerkv_data_path_loads:('shm',)", 0) >= 1, metrics
    assert metrics.get("vllm:peerkv_load_seconds:('ok',)_count", 0) >= 1, metrics
    assert metrics.get("vllm:peerkv_load_seconds:('ok',)_sum", 0) > 0, metrics
    served = a.call("metrics", "a")
    assert served.get("vllm:peerkv_data_path_bytes_sent:('shm',)", 0) >= 4 * ROW_BYTES, served


def test_pd_decoder_first(cluster):
    a, b = cluster.a, cluster.b
    keys, rows, kid = random_keys(3), random_rows(3), new_kv_id()
    b.submit("pull", "b", "d-df", cluster.source("remote_prefiller", "a", kid), keys, PULL_TIMEOUT_S)
    time.sleep(0.5)  # the decoder's fetch reaches the prefiller first
    params = {"remote_decoder": {"kv_request_id": kid}}
    a.call("store", "a", "p-df", params, keys, rows)
    a.call("finish", "a", "p-df")
    got = b.result("pull", PULL_TIMEOUT_S + 10)
    assert got["results"] == ["HIT"] * 3
    assert got["rows"] == rows
    b.call("finish", "b", "d-df")


def test_p2p_partial_hits_load_only_hits(cluster):
    a, b = cluster.a, cluster.b
    keys, rows = random_keys(5), random_rows(3)
    a.call("store", "a", "src-partial", None, keys[:3], rows)
    a.call("finish", "a", "src-partial")
    a.call("metrics", "a")
    b.call("metrics", "b")  # from here on, deltas
    got = b.call("pull", "b", "c-partial", cluster.source("remote_kv_source", "a", new_kv_id()), keys, PULL_TIMEOUT_S)
    assert got["results"] == ["HIT"] * 3 + ["MISS"] * 2
    assert got["rows"][:3] == rows and got["rows"][3:] == [None, None]
    b.call("finish", "b", "c-partial")
    metrics = b.call("metrics", "b")
    assert metrics.get("vllm:peerkv_lookup_rtt_seconds_count", 0) >= 1, metrics
    assert metrics.get("vllm:peerkv_lookup_rtt_seconds_sum", 0) > 0, metrics
    # The same, per peer: the source is labelled with its identity (the
    # per-peer list comes at most once a second: the calls are summed).
    src = (f"{HOST}:{cluster.ports['a']}",)
    metrics = _metrics_until(b, "b", metrics, f"vllm:peerkv_peer_up:{src + ('shm',)}")
    assert metrics.get(f"vllm:peerkv_peer_lookup_hits:{src}", 0) >= 3, metrics
    assert metrics.get(f"vllm:peerkv_peer_lookup_misses:{src}", 0) >= 2, metrics
    assert metrics.get(f"vllm:peerkv_peer_lookups_sent:{src}", 0) >= 1, metrics
    assert metrics.get(f"vllm:peerkv_peer_loads_ok:{src}", 0) >= 1, metrics
    assert metrics.get(f"vllm:peerkv_peer_bytes_received:{src}", 0) >= 3 * ROW_BYTES, metrics
    assert metrics.get(f"vllm:peerkv_peer_lookup_rtt_seconds:{src}_count", 0) >= 1, metrics
    assert metrics.get(f"vllm:peerkv_peer_last_lookup_rtt_seconds:{src}", 0) > 0, metrics
    assert metrics.get(f"vllm:peerkv_peer_up:{src + ('shm',)}") == 1, metrics
    assert metrics.get(f"vllm:peerkv_peer_session_age_seconds:{src}", 0) > 0, metrics
    served = a.call("metrics", "a")  # the producer's side of the same lookup
    assert served.get("vllm:peerkv_lookup_served_seconds_count", 0) >= 1, served
    consumer = (f"{HOST}:{cluster.ports['b']}",)
    served = _metrics_until(a, "a", served, f"vllm:peerkv_peer_bytes_sent:{consumer}")
    assert served.get(f"vllm:peerkv_peer_bytes_sent:{consumer}", 0) >= 3 * ROW_BYTES, served
    assert 0 < served.get("vllm:peerkv_lookup_served_seconds_sum", 0) <= metrics["vllm:peerkv_lookup_rtt_seconds_sum"]


def test_a_pull_fills_its_sources_link_in_metrics_and_links(cluster):
    """The consumer's view of what a pull from its source costs
    (docs/links.md): in PeerKVTier.links() and as per-peer gauges."""
    a, b = cluster.a, cluster.b
    keys, rows = random_keys(4), random_rows(4)
    a.call("store", "a", "src-link", None, keys, rows)
    a.call("finish", "a", "src-link")
    got = b.call("pull", "b", "c-link", cluster.source("remote_kv_source", "a", new_kv_id()), keys, PULL_TIMEOUT_S)
    assert got["results"] == ["HIT"] * 4
    b.call("finish", "b", "c-link")
    src_id = f"{HOST}:{cluster.ports['a']}"
    links = {}
    assert wait_until(lambda: links.update(b.call("links", "b")) or links.get(src_id, {}).get("pull_samples", 0) >= 1)
    link = links[src_id]
    assert link["path"] == "shm" and link["handshaked"]
    assert link["setup_s"] > 0 and link["rtt_samples"] >= 1 and link["rtt_p99_s"] >= link["rtt_p50_s"] > 0
    assert link["pull_bytes_per_s"] > 0 and link["throughput_bytes_per_s"] > 0 and link["pull_t0_s"] >= 0
    src = (src_id,)
    metrics = _metrics_until(b, "b", {}, f"vllm:peerkv_peer_pull_samples:{src}")
    assert metrics[f"vllm:peerkv_peer_pull_samples:{src}"] >= 1, metrics
    assert metrics.get(f"vllm:peerkv_peer_pull_bytes_per_second:{src}", 0) > 0, metrics
    assert metrics.get(f"vllm:peerkv_peer_setup_seconds:{src}", 0) > 0, metrics
    assert metrics.get(f"vllm:peerkv_peer_rtt_p50_seconds:{src}", 0) > 0, metrics
    assert metrics.get(f"vllm:peerkv_peer_throughput_bytes_per_second:{src + ('shm',)}", 0) > 0, metrics


def test_keys_asked_after_a_load_are_answered_in_their_own_places(cluster):
    """A request that loaded a prefix and then asks further keys (a longer
    prompt, a chunked prefill) gets each new key's own answer and row."""
    a, b = cluster.a, cluster.b
    keys, rows = random_keys(6), random_rows(5)
    a.call("store", "a", "src-more", None, keys[:5], rows)
    source = cluster.source("remote_kv_source", "a", new_kv_id())
    first = b.call("pull", "b", "c-more", source, keys[:2], PULL_TIMEOUT_S)
    assert first["results"] == ["HIT"] * 2 and first["rows"] == rows[:2]
    more = b.call("pull", "b", "c-more", source, keys, PULL_TIMEOUT_S)
    assert more["results"] == ["HIT"] * 5 + ["MISS"]
    assert more["rows"][:5] == rows
    b.call("finish", "b", "c-more")
    a.call("finish", "a", "src-more")


def test_lookups_alternating_between_requests_get_each_requests_own_answers(cluster):
    """Within one step, lookups of a P2P request, a PD decoder and a request
    without kv_transfer_params alternate key by key: each gets its own
    answers (RETRY then the source's HIT/MISS, HIT, MISS), also in the steps
    after the answers came, and after one of them finished and a new request
    took its id."""
    a, b = cluster.a, cluster.b
    keys, rows = random_keys(4), random_rows(3)
    a.call("store", "a", "src-alt", None, keys[:3], rows)
    kid = new_kv_id()
    pd_keys, pd_rows = random_keys(4), random_rows(4)
    a.call("store", "a", "pf-alt", {"remote_decoder": {"kv_request_id": kid}}, pd_keys, pd_rows)
    requests = [
        ("alt-p2p", cluster.source("remote_kv_source", "a", new_kv_id()), keys),
        ("alt-pd", cluster.source("remote_prefiller", "a", kid), pd_keys),
        ("alt-local", None, random_keys(4)),
    ]
    deadline = time.monotonic() + PULL_TIMEOUT_S
    while True:
        got = b.call("ask_interleaved", "b", requests)
        assert got["alt-pd"] == ["HIT"] * 4, got
        assert got["alt-local"] == ["MISS"] * 4, got
        if "RETRY" not in got["alt-p2p"]:
            break
        assert time.monotonic() < deadline, got
        time.sleep(0.005)
    assert got["alt-p2p"] == ["HIT"] * 3 + ["MISS"], got
    pd = b.call("pull", "b", "alt-pd", requests[1][1], pd_keys, PULL_TIMEOUT_S)  # the prefiller's store is fetched
    assert pd["results"] == ["HIT"] * 4 and pd["rows"] == pd_rows
    b.call("finish", "b", "alt-pd")
    again = b.call("ask_interleaved", "b", [requests[0], ("alt-pd", None, pd_keys)])
    assert again["alt-p2p"] == ["HIT"] * 3 + ["MISS"], again
    assert again["alt-pd"] == ["MISS"] * 4, again  # a new request under the finished one's id: its own state
    for req_id in ("alt-p2p", "alt-pd", "alt-local"):
        b.call("finish", "b", req_id)
    a.call("finish", "a", "src-alt")
    a.call("finish", "a", "pf-alt")


def test_prefiller_pulls_prefix_and_serves_decoder(cluster):
    """remote_decoder + remote_kv_source: B pulls a prefix from A, computes the
    rest, and serves everything to a decoder (a_dec) that never saw either."""
    a, b = cluster.a, cluster.b
    prefix, prefix_rows = random_keys(2), random_rows(2)
    new, new_rows = random_keys(2), random_rows(2)
    a.call("store", "a", "src-prefix", None, prefix, prefix_rows)
    a.call("finish", "a", "src-prefix")
    decode_kid = new_kv_id()
    params = {"remote_decoder": {"kv_request_id": decode_kid}}
    params.update(cluster.source("remote_kv_source", "a", new_kv_id()))
    got = b.call("pull", "b", "pp", params, prefix, PULL_TIMEOUT_S)
    assert got["results"] == ["HIT", "HIT"] and got["rows"] == prefix_rows
    b.call("store", "b", "pp", params, prefix + new, prefix_rows + new_rows)
    b.call("finish", "b", "pp")
    got = a.call("pull", "a_dec", "dec", cluster.source("remote_prefiller", "b", decode_kid), prefix + new, PULL_TIMEOUT_S)
    assert got["results"] == ["HIT"] * 4
    assert got["rows"] == prefix_rows + new_rows
    a.call("finish", "a_dec", "dec")


def test_forbidden_combination_is_rejected_and_logged_once(cluster):
    a, b = cluster.a, cluster.b
    keys, rows = random_keys(2), random_rows(2)
    a.call("store", "a", "src-forbidden", None, keys, rows)
    _logs(b)
    params = {"remote_decoder": {"kv_request_id": new_kv_id()}}
    params.update(cluster.source("remote_prefiller", "a", new_kv_id()))
    assert b.call("start", "b", "forbidden", params) == "chunk_level"
    got = b.call("pull", "b", "forbidden", params, keys, 5.0)
    assert got["results"] == ["MISS", "MISS"] and got["elapsed"] < 1.0
    b.call("finish", "b", "forbidden")
    lines = [line for line in _logs(b) if "forbidden" in line and "does not use peerkv" in line]
    assert len(lines) == 1, lines
    assert "remote_prefiller" in lines[0] and lines[0].startswith("WARNING")
    # One line, the cause first, the request named once.
    assert lines[0].startswith(f"WARNING peerkv {HOST}:{cluster.ports['b']}: bad kv_transfer_params in request forbidden,"), lines
    assert lines[0].count("forbidden,") == 1 and "peerkv_request_start" not in lines[0], lines
    a.call("finish", "a", "src-forbidden")


def test_default_data_path_is_the_same_host_copy(cluster):
    """data_transport "auto" (the default) serves shm, NIXL and TCP; two such
    peers on one host copy straight into each other's region (shm)."""
    a, b = cluster.a, cluster.b
    cluster.add(a, "a_auto")  # a fresh peer: the session (and its path choice) starts here
    keys, rows = random_keys(2), random_rows(2)
    a.call("store", "a_auto", "src-auto", None, keys, rows)
    _logs(a, b)
    got = b.call("pull", "b", "c-auto", cluster.source("remote_kv_source", "a_auto", new_kv_id()), keys, PULL_TIMEOUT_S)
    b.call("finish", "b", "c-auto")
    a.call("finish", "a_auto", "src-auto")
    assert got["results"] == ["HIT", "HIT"] and got["rows"] == rows
    assert b.call("stats", "b")["data_paths"] == "shm+nixl+tcp"
    lines = _logs(a, b)
    for peer in ("a_auto", "b"):  # each side logs the path it writes over
        assert any(f"peer {HOST}:{cluster.ports[peer]}: data path shm" in line for line in lines), (peer, lines)


def test_tcp_only_peer_and_default_peer_meet_on_tcp(cluster):
    """A peerkv peer that asks for TCP only still exchanges rows with a default
    peer, both ways, over TCP."""
    _logs(cluster.a, cluster.b)
    for producer, consumer in [("a", "b_tcp"), ("b_tcp", "a")]:
        prod, cons = cluster.nodes[producer], cluster.nodes[consumer]
        keys, rows, kid = random_keys(3), random_rows(3), new_kv_id()
        params = {"remote_decoder": {"kv_request_id": kid}}
        prod.call("store", producer, f"p-tcp-{producer}", params, keys, rows)
        prod.call("finish", producer, f"p-tcp-{producer}")
        source = cluster.source("remote_prefiller", producer, kid)
        got = cons.call("pull", consumer, f"d-tcp-{consumer}", source, keys, PULL_TIMEOUT_S)
        cons.call("finish", consumer, f"d-tcp-{consumer}")
        assert got["results"] == ["HIT"] * 3 and got["rows"] == rows, (producer, consumer)
    assert cluster.b.call("stats", "b_tcp")["data_paths"] == "tcp"
    lines = _logs(cluster.a, cluster.b)
    for name, other in [("a", "b_tcp"), ("b_tcp", "a")]:
        assert any(f"peer {HOST}:{cluster.ports[other]}: data path tcp" in line for line in lines), (name, lines)


@pytest.mark.parametrize("key", ["remote_kv_source", "remote_prefiller"])
def test_unreachable_peer_falls_back_within_deadline(cluster, key):
    b = cluster.b
    keys = random_keys(2)
    _logs(b)
    dead = control_port()
    source = {key: {"kv_request_id": new_kv_id(), "remote_host": HOST, "remote_port": dead}}
    got = b.call("pull", "b", f"unreach-{key}", source, keys, PULL_TIMEOUT_S)
    b.call("finish", "b", f"unreach-{key}")
    assert got["results"] == ["MISS", "MISS"]
    assert got["elapsed"] < FAILURE_DEADLINE_S
    assert any(f"{HOST}:{dead}" in line for line in _logs(b))


@pytest.mark.parametrize("consumer,word", [("b_fp", "fingerprint"), ("b_seed", "seed")])
def test_incompatible_peer_is_rejected_and_request_recomputes(cluster, consumer, word):
    a, b = cluster.a, cluster.b
    keys, rows = random_keys(2), random_rows(2)
    a.call("store", "a", f"src-{consumer}", None, keys, rows)
    _logs(a, b)
    got = b.call("pull", consumer, "c-" + consumer, cluster.source("remote_kv_source", "a", new_kv_id()), keys, PULL_TIMEOUT_S)
    b.call("finish", consumer, "c-" + consumer)
    a.call("finish", "a", f"src-{consumer}")
    assert got["results"] == ["MISS", "MISS"]
    assert got["elapsed"] < FAILURE_DEADLINE_S
    all_lines = _logs(a, b)
    lines = [line for line in all_lines if word in line.lower()]
    assert lines, f"no log line names the {word} mismatch: {all_lines}"
    cause = {"fingerprint": "fingerprint", "seed": "hash_seed"}[word]
    assert a.call("stats", "a")["handshake_rejections"].get(cause, 0) >= 1
    consumer_metrics = b.call("metrics", consumer)
    assert consumer_metrics.get("vllm:peerkv_handshake_rejections:('refused_by_peer',)", 0) >= 1, consumer_metrics


def test_vanishing_producer_fails_the_load_within_deadline(cluster):
    b = cluster.b
    victim = NodeProcess().ready()
    try:
        cluster.add(victim, "v")
        keys, kid = random_keys(3), new_kv_id()
        b.submit("pull", "b", "d-vanish", cluster.source("remote_prefiller", "v", kid), keys, PULL_TIMEOUT_S)
        time.sleep(1.0)  # handshake done, fetch parked at the producer
        victim.kill()
        got = b.result("pull", PULL_TIMEOUT_S + 10)
        b.call("finish", "b", "d-vanish")
        assert got["results"] == ["MISS"] * 3
        assert got["elapsed"] < 1.0 + FAILURE_DEADLINE_S
    finally:
        victim.close()


def test_shutdown_reports_jobs_and_releases_the_primary_view(cluster):
    """A producer with a parked store shuts down: the manager's own shutdown
    (tier, then primary view release and region cleanup) must succeed."""
    a = cluster.a
    cluster.add(a, "short_lived")
    params = {"remote_decoder": {"kv_request_id": new_kv_id()}}
    a.call("store", "short_lived", "parked", params, random_keys(2), random_rows(2))
    assert a.call("pending", "short_lived") is True
    # NodeError if our export of the view survived (BufferError on release).
    a.call("shutdown", "short_lived")


def test_the_short_type_form_builds_the_tier(cluster):
    """{"type": "peerkv"} without module_path, after the plugin registered
    it (the node does what vLLM's general-plugin loader does)."""
    a = cluster.a
    port = control_port()
    config = kv_transfer_config(port, type="peerkv", module_path=None)
    info = a.call("add", "short", config, timeout=60)
    assert info == {"tier_class": "PeerKVTier", "tier_type": "peerkv"}
    a.call("shutdown", "short")


def test_a_bad_tier_option_fails_the_tier_naming_it(cluster):
    with pytest.raises(NodeError) as caught:
        cluster.a.call("add", "bad", kv_transfer_config(control_port(), prot=5710, load_timeout_s="5"), timeout=60)
    assert 'unknown option "prot" (did you mean "port"?)' in str(caught.value)
    assert 'load_timeout_s must be a positive number of seconds up to 86400, got "5"' in str(caught.value)


def test_an_idle_tier_makes_no_library_call(cluster):
    """Idle (peers connected, nothing in flight), the scheduler's calls and the
    tier-poll thread read the library's news counts and call nothing."""
    pid, kid = "idle-p", new_kv_id()
    ks, rows = random_keys(2), random_rows(2)
    cluster.a.call("store", "a", pid, None, ks, rows)
    got = cluster.b.call("pull", "b", "idle-c", cluster.source("remote_kv_source", "a", kid), ks, PULL_TIMEOUT_S)
    assert got["results"] == ["HIT", "HIT"]
    cluster.b.call("finish", "b", "idle-c")
    cluster.a.call("finish", "a", pid)
    time.sleep(0.5)  # the terminal fetch and its logs land
    for node, name in ((cluster.a, "a"), (cluster.b, "b")):
        node.call("step", name, 5)  # collect what is left
        node.call("count_library_calls", name)
        node.call("step", name, 50)
        assert not node.call("pending", name)
        assert node.call("count_library_calls_taken", name) == {}, f"{name} called the library while idle"


def test_a_steps_lookups_go_to_the_library_in_one_call(cluster):
    """Every key vLLM asks in a step goes out in one call; while the answers
    travel, the lookups asked again are answered without calling in."""
    pid = "batch-p"
    ks, rows = random_keys(8), random_rows(8)
    cluster.a.call("store", "a", pid, None, ks, rows)
    cluster.b.call("count_library_calls", "b")
    req = "batch-c"
    got = cluster.b.call("pull", "b", req, cluster.source("remote_kv_source", "a", new_kv_id()), ks, PULL_TIMEOUT_S)
    assert got["results"] == ["HIT"] * 8 and got["rows"] == rows
    calls = cluster.b.call("count_library_calls_taken", "b")
    assert calls.get("lookup_packed") == 1, calls
    assert "lookup" not in calls, calls  # no call per key
    cluster.b.call("finish", "b", req)
    cluster.a.call("finish", "a", pid)


@pytest.mark.skipif(
    not HAS_TIER_POLL_THREAD,
    reason="vLLM 0.32 has no tier-poll thread; there the engine waker steps the engine (test_engine_wake.py)",
)
def test_a_pinning_producer_steps_for_the_manager_alone_and_idles_once_released(cluster):
    """With vLLM's tier-poll thread the tier asks for no step of its own: a
    producer holding rows pinned for a consumer keeps stepping because the
    pin is a job in the manager's table, and goes idle as soon as the
    consumer's request ends (its terminal fetch releases the pin)."""
    pid, cid, kid = "pin-p", "pin-c", new_kv_id()
    ks, rows = random_keys(3), random_rows(3)
    cluster.a.call("store", "a", pid, None, ks, rows)
    cluster.a.call("finish", "a", pid)
    assert wait_until(lambda: not cluster.a.call("pending", "a"), 5.0), "the producer never went idle"
    assert cluster.b.call("ask", "b", cid, cluster.source("remote_kv_source", "a", kid), ks) == ["RETRY"] * 3
    # A answers on its poll thread and pins the three rows until B fetches or ends.
    assert wait_until(lambda: cluster.a.call("pending", "a"), 5.0), "the producer's manager holds no pin job"
    assert not cluster.a.call("tier_pending", "a")
    assert not cluster.b.call("tier_pending", "b")
    cluster.b.call("finish", "b", cid)
    released_within = FAST_TIMEOUTS["store_timeout_s"] / 2  # well before the pin would expire
    assert wait_until(lambda: not cluster.a.call("pending", "a"), released_within), (
        "the producer kept its pin (and its engine stepping) after the consumer's request ended"
    )


@pytest.mark.skipif(
    not HAS_TIER_POLL_THREAD,
    reason="vLLM 0.32 has no tier-poll thread; there the engine waker steps an idle producer (test_engine_wake.py)",
)
def test_an_idle_producer_answers_without_waiting_for_vllms_poll_interval(cluster):
    """vLLM's tier-poll thread serves a producer's peers every
    tier_poll_interval_s; the library's signal has the tier run that round at
    once, so a producer whose engine does not step answers well inside it."""
    interval_s = 60.0
    if "a_slow_poll" not in cluster.nodes:
        cluster.add(cluster.a, "a_slow_poll", spec_options={"tier_poll_interval_s": interval_s})
    pid, kid = "slow-poll-p", new_kv_id()
    ks, rows = random_keys(4), random_rows(4)
    cluster.a.call("store", "a_slow_poll", pid, None, ks, rows)  # its last step, then none
    started = time.monotonic()
    got = cluster.b.call("pull", "b", "slow-poll-c", cluster.source("remote_kv_source", "a_slow_poll", kid), ks, 10.0)
    elapsed = time.monotonic() - started
    cluster.b.call("finish", "b", "slow-poll-c")
    cluster.a.call("finish", "a_slow_poll", pid)
    assert got["results"] == ["HIT"] * 4 and got["rows"] == rows
    assert elapsed < interval_s / 6, f"the pull took {elapsed:.1f} s"


@pytest.mark.skipif(
    not HAS_TIER_POLL_THREAD,
    reason="vLLM 0.32 has no tier-poll thread; there the engine waker steps an idle producer (test_engine_wake.py)",
)
def test_a_producer_whose_early_poller_ended_is_stepped_for_a_peers_lookup(cluster):
    """With vLLM's tier-poll thread the tier asks for a step only while a
    peer's lookup is being served. Once its own early poller has ended (it
    gives up after failing rounds) the tier cannot tell whether vLLM's thread
    still runs (it gives up too), so it reports the library's news as work:
    the engine steps and answers the peer instead of leaving it unanswered."""
    interval_s = 60.0  # vLLM's own rounds come too late to serve this pull
    cluster.add(cluster.a, "a_poll_ended", spec_options={"tier_poll_interval_s": interval_s})
    pid, kid = "poll-ended-p", new_kv_id()
    ks, rows = random_keys(4), random_rows(4)
    cluster.a.call("store", "a_poll_ended", pid, None, ks, rows)  # starts the early poller
    cluster.a.call("end_early_poll", "a_poll_ended")
    try:
        started = time.monotonic()
        got = cluster.b.call(
            "pull", "b", "poll-ended-c", cluster.source("remote_kv_source", "a_poll_ended", kid), ks, 10.0
        )
        elapsed = time.monotonic() - started
        cluster.b.call("finish", "b", "poll-ended-c")
        cluster.a.call("finish", "a_poll_ended", pid)
        assert got["results"] == ["HIT"] * 4 and got["rows"] == rows
        assert elapsed < interval_s / 6, f"the pull took {elapsed:.1f} s"
    finally:
        cluster.a.call("shutdown", "a_poll_ended")


def _tier_answers(node, name, req_id, params, keys):
    """The tier's own answers to one step of lookups (no promotion starts)."""
    return node.call("ask_interleaved", name, [(req_id, params, keys)])[req_id]


@pytest.mark.parametrize("decoder", [{}, {"remote_host": HOST, "remote_port": 5710}])
def test_a_store_for_a_remote_decoder_without_kv_request_id_fails_as_in_vllm(cluster, decoder):
    """vLLM's tier fails a store whose remote_decoder block names no
    kv_request_id (no decoder can ever fetch it); a store of a request that
    names no decoder at all still succeeds."""
    a, name = cluster.a, "a_no_id"
    cluster.add(a, name)  # a tier of its own: no other test's store is counted
    failures = "vllm:kv_offload_tiering_cascade_job_failures"
    counted = [0]

    def failed_stores():  # each metrics call returns what was counted since the last one
        counted[0] += sum(v for k, v in a.call("metrics", name).items() if k.startswith(failures))
        return counted[0]

    try:
        a.call("store", name, "no-decoder", None, random_keys(2), random_rows(2))
        a.call("finish", name, "no-decoder")
        a.call("step", name, 3)
        assert failed_stores() == 0
        a.call("store", name, "decoder-no-id", {"remote_decoder": decoder}, random_keys(2), random_rows(2))
        a.call("step", name, 3)
        assert wait_until(lambda: failed_stores() == 1, 5.0), "the store was reported successful"
        a.call("finish", name, "decoder-no-id")
    finally:
        a.call("shutdown", name)


def test_a_failed_kv_request_id_answers_miss_until_its_requests_finish(cluster):
    """As vLLM's tier: once a decoder's pull under a kv_request_id failed,
    another request naming that id (a retry of the same transfer) answers
    MISS at once instead of waiting on the dead prefiller again, until every
    request naming the id has finished; then the id is forgotten."""
    b, key, first_answer = cluster.b, "remote_prefiller", "HIT"
    keys, kid = random_keys(2), new_kv_id()
    source = {key: {"kv_request_id": kid, "remote_host": HOST, "remote_port": control_port()}}  # nothing listens
    got = b.call("pull", "b", f"failed-1-{key}", source, keys, PULL_TIMEOUT_S)
    assert got["results"] == ["MISS", "MISS"]
    assert _tier_answers(b, "b", f"failed-2-{key}", source, keys) == ["MISS", "MISS"]
    # Other ids are untouched (at another dead port: this one is backed off for a moment, whatever the id).
    other = {key: dict(source[key], kv_request_id=new_kv_id(), remote_port=control_port())}
    assert _tier_answers(b, "b", f"other-{key}", other, keys) == [first_answer] * 2
    b.call("finish", "b", f"other-{key}")
    b.call("finish", "b", f"failed-1-{key}")
    assert _tier_answers(b, "b", f"failed-3-{key}", source, keys) == ["MISS", "MISS"]  # failed-2 still names it
    b.call("finish", "b", f"failed-2-{key}")
    b.call("finish", "b", f"failed-3-{key}")
    time.sleep(1.5)  # the dead port's back-off (1 s after its one failed connect) is over: a fresh request dials it
    assert _tier_answers(b, "b", f"failed-4-{key}", source, keys) == [first_answer] * 2
    b.call("finish", "b", f"failed-4-{key}")

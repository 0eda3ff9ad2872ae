"""kv_transfer_params keys of llm-d's older sidecar (prefill/decode/p2p) and
of NixlConnector (do_remote_prefill/do_remote_decode) mean nothing to
peerkv's tier: the first request that carries any says so once per process,
at INFO, naming the key to send instead; the request is served locally as
before. (Its own process: the note is once per process.)"""

import pytest

from peerkv_node import NodeProcess, control_port, kv_transfer_config, new_kv_id

NOTE = "are ignored by peerkv's tier"


@pytest.fixture(scope="module")
def node(library):
    node = NodeProcess()
    try:
        node.ready()
        for name in ("a", "b"):
            node.call("add", name, kv_transfer_config(control_port()), timeout=60)
        yield node
    finally:
        node.close()


def notes(node):
    return [line for line in node.call("take_logs") if NOTE in line]


def test_legacy_keys_are_named_once_per_process_with_what_to_send(node):
    node.call("take_logs")
    # A request without them says nothing.
    node.call("start", "a", "plain-" + new_kv_id()[:8], {"remote_decoder": {"kv_request_id": new_kv_id()}})
    assert notes(node) == []

    req = "legacy-" + new_kv_id()[:8]
    node.call("start", "a", req, {"do_remote_prefill": True, "remote_engine_id": "e1", "remote_host": "10.0.0.2"})
    lines = notes(node)
    assert len(lines) == 1, lines
    assert lines[0].startswith("INFO "), lines
    assert "do_remote_prefill" in lines[0] and "remote_prefiller" in lines[0], lines
    node.call("finish", "a", req)

    # Not again: other legacy keys, another request, another tier of the process.
    for name, params in (("a", {"do_remote_prefill": True}), ("b", {"p2p": {"remote_host": "10.0.0.2"}}),
                         ("b", {"prefill": {}, "decode": {}})):
        req = "legacy-" + new_kv_id()[:8]
        node.call("start", name, req, params)
        node.call("finish", name, req)
    assert notes(node) == []

"""The ctypes binding against the real library: one Node, no vLLM."""

import json
import os
import select
import subprocess
import sys
import time

import pytest

import peerkv
from conftest import REPO
from peerkv_node import control_port

KEY_LEN = 36
ROWS, ROW_LEN = 8, 4096


@pytest.fixture
def region():
    return bytearray(ROWS * ROW_LEN)


def _options(**extra):
    options = {"host": "127.0.0.1", "port": control_port(), "data_port": 0, "key_len": KEY_LEN, "drain_timeout_s": 2.0}
    options.update(extra)
    return options


def test_library_loads_with_defaults(library):
    major, _ = peerkv.abi_version()
    assert major == 1
    assert peerkv.is_loaded()
    assert os.environ["UCX_HANDLE_ERRORS"] == "none"
    assert peerkv.version().startswith("peerkv")
    host = peerkv.info()
    assert {"version", "abi", "gpus", "nvml", "nixl", "data_paths", "go_max_procs", "options_schema"} <= set(host)


def test_create_lookup_and_lifecycle(library, region):
    with peerkv.Node(region, ROWS, ROW_LEN, _options()) as node:
        assert node.handle != 0
        key = bytes(range(KEY_LEN))
        # Unknown request: every key MISS, no error.
        assert node.lookup("nobody", [key, key]) == [peerkv.LOOKUP_MISS] * 2
        assert node.request_start("plain", None) == peerkv.POLICY_BLOCK_LEVEL
        with pytest.raises(peerkv.DuplicateError):
            node.request_start("plain", None)
        # A store for a request that serves nobody succeeds at once.
        node.submit_store("plain", 7, [key], [3])
        finished = []
        for _ in range(200):
            finished += node.get_finished()
            if finished:
                break
        assert [(r.job_id, r.success, r.is_load) for r in finished] == [(7, True, False)]
        assert node.next_inbound() is None
        node.request_finish("plain")
        stats = node.stats()
        assert isinstance(stats, dict) and stats
        node.drain()
        assert isinstance(node.take_logs(), list)
        node.shutdown()
        node.shutdown()  # idempotent
    assert node.handle == 0


def test_errors_carry_the_library_message(library, region):
    options = _options()
    with peerkv.Node(region, ROWS, ROW_LEN, options) as node:
        with pytest.raises(peerkv.TransportError) as in_use:
            peerkv.Node(bytearray(ROWS * ROW_LEN), ROWS, ROW_LEN, dict(options))
        assert in_use.value.code == -6 and in_use.value.message
        forbidden = {
            "remote_prefiller": {"kv_request_id": "a", "remote_host": "127.0.0.1", "remote_port": 1},
            "remote_decoder": {"kv_request_id": "a"},
        }
        with pytest.raises(peerkv.BadParamsError) as bad:
            node.request_start("r1", forbidden)
        assert "remote_prefiller" in bad.value.message
        with pytest.raises(peerkv.InvalidArgumentError):
            node.submit_store("r1", 1, [b"x" * KEY_LEN], [ROWS + 5])
    with pytest.raises(peerkv.InvalidArgumentError) as unknown:
        peerkv.Node(region, ROWS, ROW_LEN, _options(no_such_option=1))
    assert "no_such_option" in unknown.value.message


def test_ld_bind_now_is_refused_clearly(library):
    code = "import peerkv; peerkv.abi_version()"
    env = dict(os.environ, LD_BIND_NOW="1", PYTHONPATH=str(REPO / "python"))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "LD_BIND_NOW" in proc.stderr and "LibraryLoadError" in proc.stderr


def test_missing_library_is_a_clear_error(tmp_path):
    code = "import peerkv; peerkv.abi_version()"
    env = dict(os.environ, PEERKV_LIBRARY=str(tmp_path / "nope.so"), PYTHONPATH=str(REPO / "python"))
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0 and "libpeerkv not found" in proc.stderr


def test_options_reach_the_library_as_json(library, region):
    # Every deadline option the header names is accepted.
    names = json.loads(
        '["handshake_timeout_s","lookup_timeout_s","load_timeout_s","abort_ack_timeout_s",'
        '"store_timeout_s","unbound_store_timeout_s","inbound_lookup_timeout_s",'
        '"shutdown_drain_timeout_s","drain_timeout_s"]'
    )
    with peerkv.Node(region, ROWS, ROW_LEN, _options(**{n: 1.5 for n in names})):
        pass


def _readable(fd, timeout):
    ready, _, _ = select.select([fd], [], [], timeout)
    return bool(ready)


def test_notify_fd_wakes_the_producer_when_a_lookup_arrives(library):
    prod_region, cons_region = bytearray(ROWS * ROW_LEN), bytearray(ROWS * ROW_LEN)
    prod_options = _options(data_transport="tcp")
    with peerkv.Node(prod_region, ROWS, ROW_LEN, prod_options) as prod, \
            peerkv.Node(cons_region, ROWS, ROW_LEN, _options(data_transport="tcp")) as cons:
        fd = prod.notify_fd()
        assert fd >= 0 and prod.notify_fd() == fd
        assert not _readable(fd, 0.05), "nothing to collect on a fresh node"

        keys = [bytes([i]) * KEY_LEN for i in (1, 2)]
        source = {"kv_request_id": "kv-notify", "remote_host": "127.0.0.1", "remote_port": prod_options["port"]}
        cons.request_start("c", {"remote_kv_source": source})
        deadline = time.monotonic() + 10
        while True:  # the first step after the handshake sends the lookup
            assert cons.lookup("c", keys) == [peerkv.LOOKUP_RETRY] * 2
            cons.on_schedule_end()
            if _readable(fd, 0.01):
                break
            assert time.monotonic() < deadline, "the producer's notify_fd never became readable"
        assert int.from_bytes(os.read(fd, 8), sys.byteorder) >= 1
        assert not _readable(fd, 0), "reading resets it"
        item = prod.next_inbound()
        assert item is not None and item.kind == peerkv.INBOUND_EVALUATE and item.keys == keys
        assert prod.answer_inbound(item.lookup_id, [peerkv.LOOKUP_MISS] * 2)
        assert prod.next_inbound() is None
        cons.request_finish("c")
        prod.shutdown()
        assert _readable(fd, 1), "shutdown wakes the host"
    with pytest.raises(peerkv.UnknownHandleError):
        prod.notify_fd()


def test_one_packed_call_asks_each_requests_keys_of_its_source(library):
    """lookup_packed (the tier's one call per step) and lookup_many carry each
    request's own keys to the producer; a bad call is refused whole."""
    prod_region, cons_region = bytearray(ROWS * ROW_LEN), bytearray(ROWS * ROW_LEN)
    prod_options = _options(data_transport="tcp")
    with peerkv.Node(prod_region, ROWS, ROW_LEN, prod_options) as prod, \
            peerkv.Node(cons_region, ROWS, ROW_LEN, _options(data_transport="tcp")) as cons:
        asked = {"a": [bytes([1]) * KEY_LEN, bytes([2]) * KEY_LEN], "b": [bytes([3]) * KEY_LEN], "c": []}
        for req in asked:
            source = {"kv_request_id": f"kv-{req}", "remote_host": "127.0.0.1", "remote_port": prod_options["port"]}
            cons.request_start(req, {"remote_kv_source": source})
            assert cons.lookup_mode(req) == peerkv.node.LOOKUPS_ASK
        ids = [b"a", b"b", b"c"]
        with pytest.raises(peerkv.InvalidArgumentError):
            cons.lookup_packed([b"a\0b", b"b", b"c"], [2, 1, 0], b"".join(asked["a"] + asked["b"]), KEY_LEN)
        with pytest.raises(peerkv.InvalidArgumentError):
            cons.lookup_packed(ids, [2, 1, 0], b"".join(asked["a"] + asked["b"])[:-1], KEY_LEN)
        with pytest.raises(peerkv.InvalidArgumentError):
            cons.lookup_packed(ids, [2, 1], b"".join(asked["a"] + asked["b"]), KEY_LEN)
        with pytest.raises(peerkv.InvalidArgumentError):
            cons.lookup_packed(ids, [3, -1, 0], b"".join(asked["a"] + asked["b"]), KEY_LEN)
        with pytest.raises(peerkv.InvalidArgumentError):
            cons.lookup_packed(ids, [0, 0, 0], b"extra", KEY_LEN)
        with pytest.raises(peerkv.InvalidArgumentError):  # three keys of three lengths, 3 x KEY_LEN bytes in all
            cons.lookup_many([("b", [b"\4" * KEY_LEN, b"\5" * (KEY_LEN // 2), b"\6" * (KEY_LEN * 3 // 2)])])
        with pytest.raises(peerkv.InvalidArgumentError):  # the library's key_len is KEY_LEN
            cons.lookup_packed(ids, [2, 1, 0], b"".join(asked["a"] + asked["b"]) + b"\0\0\0", KEY_LEN + 1)
        packed = cons.lookup_packed(ids, [2, 1, 0], b"".join(asked["a"] + asked["b"]), KEY_LEN)
        assert list(packed) == [peerkv.LOOKUP_RETRY] * 3
        assert list(cons.lookup_many([])) == []  # a step's end with nothing to ask
        assert list(cons.lookup_many([("a", asked["a"])])) == [peerkv.LOOKUP_RETRY] * 2  # asked already
        got: dict[str, list[bytes]] = {}
        deadline = time.monotonic() + 10
        while len(got) < 2:  # the handshake, then one lookup per request with keys
            cons.on_schedule_end()
            item = prod.next_inbound()
            if item is None:
                assert time.monotonic() < deadline, f"the producer got only {sorted(got)}"
                time.sleep(0.01)
                continue
            assert item.kind == peerkv.INBOUND_EVALUATE
            kv_id = next(kv for kv in ("kv-a", "kv-b", "kv-c") if f":{kv}:" in item.req_id)  # the lookup's id names it
            assert kv_id not in got
            got[kv_id] = item.keys
            prod.answer_inbound(item.lookup_id, [peerkv.LOOKUP_MISS] * len(item.keys))
        assert got == {"kv-a": asked["a"], "kv-b": asked["b"]}


def _answer_record(req_id: bytes, positions, results: bytes, failed: bool = False) -> bytes:
    """One peerkv_take_answers record (include/peerkv.h), padded to 4 bytes."""
    import struct

    def pad(b: bytes) -> bytes:
        return b + b"\0" * (-len(b) % 4)

    head = pad(struct.pack("<I", len(req_id)) + req_id)
    return head + struct.pack(f"<II{len(positions)}I", int(failed), len(positions), *positions) + pad(results)


def test_answer_changes_read_positions_in_order_as_a_range():
    """A change of a request's first keys in order is read without an int per
    key, and reads the same as any other change."""
    from peerkv.node import _parse_answers

    raw = (_answer_record(b"first", range(5), bytes([2] * 5))
           + _answer_record(b"later", [3, 1, 2], bytes([1, 2, 2]))
           + _answer_record(b"gap", [0, 1, 3], bytes([2, 2, 2]))
           + _answer_record(b"failed", [], b"", failed=True))
    got = _parse_answers(raw)
    assert [c.req_id for c in got] == ["first", "later", "gap", "failed"]
    assert type(got[0].positions) is range and list(got[0].positions) == [0, 1, 2, 3, 4]
    assert list(got[1].positions) == [3, 1, 2] and got[1].results == bytes([1, 2, 2])
    assert list(got[2].positions) == [0, 1, 3] and type(got[2].positions) is not range
    assert got[3].failed and list(got[3].positions) == []


def test_links_lists_each_live_peers_link(library):
    """Node.links(): per peer, the round trips, setup and pull model the
    library keeps; answered from the newest list between the library's
    once-a-second ones."""
    prod_region, cons_region = bytearray(ROWS * ROW_LEN), bytearray(ROWS * ROW_LEN)
    prod_options = _options(data_transport="tcp")
    with peerkv.Node(prod_region, ROWS, ROW_LEN, prod_options) as prod, \
            peerkv.Node(cons_region, ROWS, ROW_LEN, _options(data_transport="tcp")) as cons:
        assert cons.links() == {}
        keys = [bytes([7]) * KEY_LEN]
        source = {"kv_request_id": "kv-links", "remote_host": "127.0.0.1", "remote_port": prod_options["port"]}
        cons.request_start("c", {"remote_kv_source": source})
        deadline = time.monotonic() + 10
        while cons.lookup("c", keys) == [peerkv.LOOKUP_RETRY]:
            cons.on_schedule_end()
            item = prod.next_inbound()
            if item is not None and item.kind == peerkv.INBOUND_EVALUATE:
                prod.answer_inbound(item.lookup_id, [peerkv.LOOKUP_MISS])
            assert time.monotonic() < deadline, "the lookup was never answered"
            time.sleep(0.005)
        prod_id = f"127.0.0.1:{prod_options['port']}"
        deadline = time.monotonic() + 5
        while prod_id not in cons.links():  # the library lists peers at most once a second
            assert time.monotonic() < deadline, "the live peer never showed in links()"
            time.sleep(0.05)
        cons.stats()  # a host reading its stats in between gets no list; links() still has it
        links = cons.links()
        assert set(links) == {prod_id}
        link = links[prod_id]
        assert link["path"] == "tcp" and link["handshaked"]
        assert link["setup_s"] > 0
        assert link["rtt_samples"] >= 1 and link["rtt_p99_s"] >= link["rtt_p50_s"] > 0
        assert link["pull_samples"] == 0 and link["pull_bytes_per_s"] == 0, "nothing fetched: no pull model"
        assert link["failures"] == {"transfer": 0, "aborted": 0, "bad_frame": 0}
        assert 0 <= link["as_of_s"] < 5
        cons.request_finish("c")

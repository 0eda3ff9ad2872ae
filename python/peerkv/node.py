"""`Node`: a small object API over one libpeerkv handle (this process's node).

A *peer* is always a remote node; `peerkv.Peer` and the module `peerkv.peer`
are deprecated aliases of `Node` and this module, kept for compatibility.

Thin by design: argument marshalling and status-code translation only, no
protocol logic. Output buffers are allocated once per Node and reused; calls
that use them are serialised by a lock (the library serialises per handle
anyway). The blocking calls (drain, shutdown, destroy) use their own buffers
so they never hold that lock while waiting.
"""

from __future__ import annotations

import atexit
import ctypes
import json
import struct
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from ctypes import byref, c_int32, c_int64, c_size_t
from typing import Any, NamedTuple

from peerkv import _lib
from peerkv.errors import OK, ERR_BUFFER_TOO_SMALL, InvalidArgumentError, error_for

try:  # numpy ships with vLLM; the binding also works without it.
    import numpy as _np
except ImportError:  # pragma: no cover - exercised only in bare venvs
    _np = None
from array import array as _array
from itertools import accumulate

# The array typecode of size_t (and of a pointer): counts and id pointers of
# peerkv_lookup_many are passed as arrays, not ctypes arrays.
_SIZE_T = next(code for code in "LQ" if _array(code).itemsize == ctypes.sizeof(c_size_t) == ctypes.sizeof(ctypes.c_void_p))

LOOKUP_MISS = 1
LOOKUP_HIT = 2
LOOKUP_HIT_PENDING = 3
LOOKUP_RETRY = 4

LOOKUPS_MISS = 0  # peerkv_request_lookup_mode: every key MISS
LOOKUPS_HIT = 1  # every key HIT until a load fails (PD decoder)
LOOKUPS_ASK = 2  # keys are asked of the sources

NEWS_RESULTS = 0  # indexes of Node.news()
NEWS_ANSWERS = 1
NEWS_INBOUND = 2
NEWS_LOGS = 3
NEWS_COUNT = 4

POLICY_BLOCK_LEVEL = 0
POLICY_REQUEST_LEVEL = 1

INBOUND_EVALUATE = 1
INBOUND_FINISH = 2

_NO_WORK = 1  # peerkv_next_inbound: nothing queued
_ERR_CAP = 1024
_FINISHED_CAP = 256
_LOG_CAP = 64 << 10


class JobResult(NamedTuple):
    job_id: int
    success: bool
    is_load: bool
    bytes: int
    seconds: float


class AnswerChange(NamedTuple):
    """What changed for one request since the last take_answers."""

    req_id: str
    failed: bool  # every key MISS from now on
    # Indexes into the order the request first asked its keys: range(n) when
    # they are its first n keys in order (n <= 4096; every key of a first
    # ask answered before this take), else a tuple. Compare as lists.
    positions: Sequence[int]
    results: bytes  # LOOKUP_* per position


# Positions 0, 1, 2, ... as take_answers writes them: a change whose
# positions match a prefix is parsed as a range, without an int per key.
_IN_ORDER = struct.pack(f"<{1 << 12}I", *range(1 << 12))


def _parse_answers(raw: bytes) -> list[AnswerChange]:
    """peerkv_take_answers' records (include/peerkv.h)."""
    out: list[AnswerChange] = []
    at, end = 0, len(raw)
    while at < end:
        (id_len,) = struct.unpack_from("<I", raw, at)
        at += 4
        req_id = raw[at : at + id_len].decode("utf-8", "replace")
        at = (at + id_len + 3) & ~3
        flags, n = struct.unpack_from("<II", raw, at)
        at += 8
        size = 4 * n
        if size <= len(_IN_ORDER) and raw[at : at + size] == _IN_ORDER[:size]:
            positions: Sequence[int] = range(n)
        else:
            positions = struct.unpack_from(f"<{n}I", raw, at)
        at += size
        out.append(AnswerChange(req_id, bool(flags & 1), positions, raw[at : at + n]))
        at = (at + n + 3) & ~3
    return out


class Inbound(NamedTuple):
    lookup_id: int
    kind: int  # INBOUND_EVALUATE or INBOUND_FINISH
    first: bool
    req_id: str
    keys: list[bytes]  # empty for INBOUND_FINISH


def _keys_blob(keys: bytes | Sequence[bytes], key_len: int) -> tuple[bytes, int, int]:
    """(concatenation, key_len, count) for keys given as a list or one blob."""
    if isinstance(keys, (bytes, bytearray, memoryview)):
        blob = bytes(keys)
        if key_len <= 0:
            raise InvalidArgumentError("key_len is needed to split a key blob")
        if len(blob) % key_len:
            raise InvalidArgumentError(
                f"key blob of {len(blob)} bytes is not a multiple of key_len {key_len}"
            )
        return blob, key_len, len(blob) // key_len
    keys = list(keys)
    if not keys:
        return b"", key_len, 0
    length = len(keys[0])
    blob = b"".join(keys)
    if len(blob) != length * len(keys):
        raise InvalidArgumentError("keys of different lengths in one call")
    return blob, length, len(keys)


def _int64_slots(slots: Any) -> tuple[Any, int, int]:
    """(owner, address, count) of slots as contiguous int64 values."""
    if _np is not None:
        arr = _np.ascontiguousarray(slots, dtype=_np.int64)
        return arr, arr.ctypes.data, arr.shape[0]
    arr = _array("q", slots)
    address, count = arr.buffer_info()
    return arr, address, count


def _address(arr: _array | None) -> int | None:
    """Where arr's items are (None: NULL); arr must outlive the call it is passed to."""
    return None if arr is None else arr.buffer_info()[0]


def _result_codes(results: Iterable[int]) -> _array:
    return _array("i", results)


class Node:
    """This process's node: binds host:port and serves/pulls rows of a host
    region to and from its peers (the remote nodes).

    ``region`` is a writable buffer (kept alive by the Node until destroy) or
    an integer address the caller keeps valid. ``options`` is the JSON object
    of peerkv_create (see include/peerkv.h), given as a dict; its
    ``python_prefix`` defaults to this interpreter's ``sys.prefix``, so the
    library finds the nixl wheels of the environment it runs in.
    """

    def __init__(
        self,
        region: Any,
        num_rows: int,
        row_len: int,
        options: dict[str, Any] | None = None,
    ) -> None:
        self._handle = 0
        self._lib = _lib.lib()
        self._lock = threading.Lock()
        self._err = ctypes.create_string_buffer(_ERR_CAP)
        options = {"python_prefix": sys.prefix, **(options or {})}
        key_len = options.get("key_len")  # the library checks it, naming it
        self.key_len = key_len if isinstance(key_len, int) and not isinstance(key_len, bool) else 0
        if isinstance(region, int):
            self._region_owner = None
            address = region
        else:
            self._region_owner = ctypes.c_char.from_buffer(region)
            address = ctypes.addressof(self._region_owner)
        if num_rows < 0 or row_len <= 0:
            raise InvalidArgumentError(f"bad region shape {num_rows} x {row_len}")
        handle = c_int64(0)
        rc = self._lib.peerkv_create(
            _lib.ABI_MAJOR,
            address,
            num_rows,
            row_len,
            json.dumps(options).encode(),
            byref(handle),
            self._err,
            _ERR_CAP,
        )
        if rc != OK:
            self._region_owner = None
            raise self._error(rc)
        self._handle = handle.value
        self._init_buffers()
        _live_nodes.add(self)

    def _init_buffers(self) -> None:
        self._policy = c_int32()
        self._count = c_size_t()
        self._needed = c_size_t()
        self._finished = (_lib.JobResultStruct * _FINISHED_CAP)()
        self._lookup_results = (c_int32 * 64)()
        self._lookup_id = c_int64()
        self._kind = c_int32()
        self._first = c_int32()
        self._flag = c_int32()
        self._req_id_buf = ctypes.create_string_buffer(256)
        self._keys_buf = ctypes.create_string_buffer(64 * max(self.key_len, 1))
        self._log_buf = ctypes.create_string_buffer(_LOG_CAP)
        self._answers_buf = ctypes.create_string_buffer(64 << 10)
        self._mode = c_int32()
        self._stats_buf = ctypes.create_string_buffer(4096)
        # The newest "peers" list stats() read (the library sends it at most
        # once a second) and when: links() answers from it in between.
        self._peers_seen: list[Any] = []
        self._peers_seen_at = 0.0

    # -- status handling ------------------------------------------------

    def _error(self, rc: int, err: Any = None):
        message = (err if err is not None else self._err).value.decode(
            "utf-8", "replace"
        )
        return error_for(rc, message)

    def _check(self, rc: int) -> None:
        if rc != OK:
            raise self._error(rc)

    def _h(self) -> int:
        if _lib.in_forked_child():
            raise _lib._fork_error()
        return self._handle

    @property
    def handle(self) -> int:
        return self._handle

    # -- requests -------------------------------------------------------

    def request_start(self, req_id: str, kv_transfer_params: Any = None) -> int:
        """Starts a request; returns POLICY_BLOCK_LEVEL or POLICY_REQUEST_LEVEL."""
        if kv_transfer_params is None or isinstance(kv_transfer_params, (str, bytes)):
            params = kv_transfer_params
        else:
            params = json.dumps(kv_transfer_params)
        if isinstance(params, str):
            params = params.encode()
        with self._lock:
            rc = self._lib.peerkv_request_start(
                self._h(), req_id.encode(), params, byref(self._policy), self._err, _ERR_CAP
            )
            self._check(rc)
            return self._policy.value

    def lookup(self, req_id: str, keys: bytes | Sequence[bytes]) -> list[int]:
        """LOOKUP_* per key (HIT, MISS or RETRY)."""
        blob, key_len, n = _keys_blob(keys, self.key_len)
        if n == 0:
            return []
        with self._lock:
            if n > len(self._lookup_results):
                self._lookup_results = (c_int32 * max(n, 2 * len(self._lookup_results)))()
            rc = self._lib.peerkv_lookup(
                self._h(), req_id.encode(), blob, key_len, n,
                self._lookup_results, self._err, _ERR_CAP,
            )
            self._check(rc)
            return self._lookup_results[:n]

    def lookup_mode(self, req_id: str) -> int:
        """LOOKUPS_MISS, _HIT or _ASK for a started request; from now on its
        changed answers are reported to take_answers."""
        with self._lock:
            rc = self._lib.peerkv_request_lookup_mode(
                self._h(), req_id.encode(), byref(self._mode), self._err, _ERR_CAP
            )
            self._check(rc)
            return self._mode.value

    def lookup_many(self, requests: Sequence[tuple[str | bytes, Sequence[bytes]]]) -> Sequence[int]:
        """lookup for several requests and on_schedule_end, in one call; the
        LOOKUP_* of every key, in order. A request id may be given encoded
        (UTF-8)."""
        ids: list[bytes] = []
        counts: list[int] = []
        parts: list[bytes] = []
        key_len = 0
        for req_id, ks in requests:
            ids.append(req_id if isinstance(req_id, bytes) else req_id.encode())
            counts.append(len(ks))
            parts.append(b"".join(ks))
            if ks and not key_len:
                key_len = len(ks[0])
            if any(len(k) != key_len for k in ks):
                raise InvalidArgumentError("keys of different lengths in one call")
        return self.lookup_packed(ids, counts, b"".join(parts), key_len)

    def lookup_packed(self, ids: Sequence[bytes], counts: Sequence[int], keys: bytes, key_len: int) -> Sequence[int]:
        """lookup_many with the keys already packed, as the vLLM tier calls it
        once per step: request ids[i] (bytes, UTF-8) asks counts[i] keys of
        key_len bytes, back to back in keys."""
        n = len(ids)
        if len(counts) != n:
            raise InvalidArgumentError(f"{len(counts)} key counts for {n} requests")
        if n and min(counts) < 0:
            raise InvalidArgumentError("a negative key count")
        total = sum(counts)
        if total and key_len <= 0:
            raise InvalidArgumentError(f"key_len {key_len} with {total} keys")
        if len(keys) != total * max(key_len, 0):
            raise InvalidArgumentError(f"{len(keys)} bytes of keys for {total} keys of {key_len} bytes")
        id_arr = count_arr = None  # no request: the call is on_schedule_end
        if n:
            # The ids as one NUL-separated buffer (alive until the call returns)
            # and an array of pointers into it: a ctypes array of c_char_p
            # costs more than the rest of the call.
            id_blob = b"\0".join(ids) + b"\0"
            if id_blob.count(0) != n:
                raise InvalidArgumentError("a request id contains a NUL byte")
            base = ctypes.cast(ctypes.c_char_p(id_blob), ctypes.c_void_p).value
            id_arr = _array(_SIZE_T, accumulate([len(i) + 1 for i in ids[:-1]], initial=base))
            count_arr = _array(_SIZE_T, counts)
        results = (c_int32 * total)()
        with self._lock:
            rc = self._lib.peerkv_lookup_many(
                self._h(), n, _address(id_arr), _address(count_arr), keys, key_len, results, self._err, _ERR_CAP,
            )
            self._check(rc)
        return results

    def take_answers(self) -> list[AnswerChange]:
        """Every changed answer queued since the last call."""
        out: list[AnswerChange] = []
        with self._lock:
            while True:
                rc = self._lib.peerkv_take_answers(
                    self._h(), self._answers_buf, len(self._answers_buf), byref(self._count),
                    self._err, _ERR_CAP,
                )
                if rc == ERR_BUFFER_TOO_SMALL:
                    self._answers_buf = ctypes.create_string_buffer(
                        max(self._count.value, 2 * len(self._answers_buf))
                    )
                    continue
                self._check(rc)
                n = self._count.value
                if n == 0:
                    return out
                out.extend(_parse_answers(ctypes.string_at(self._answers_buf, n)))

    def probe(self, peer: str, timeout_s: float = 5.0) -> dict[str, Any]:
        """A handshake-only probe of peer ("host:port"); see peerkv_probe."""
        err = ctypes.create_string_buffer(_ERR_CAP)
        buf = ctypes.create_string_buffer(16 << 10)
        needed = c_size_t()
        rc = self._lib.peerkv_probe(
            self._h(), peer.encode(), timeout_s, buf, len(buf), byref(needed), err, _ERR_CAP
        )
        if rc != OK:
            raise self._error(rc, err)
        return json.loads(buf.value.decode())

    def news(self) -> Any:
        """The library's news counts, NEWS_COUNT integers read without a call
        (index with NEWS_*); None where the library cannot provide them. The
        memory stays valid for the life of the process."""
        words = ctypes.c_void_p()
        with self._lock:
            rc = self._lib.peerkv_news(self._h(), byref(words), self._err, _ERR_CAP)
            if rc != OK:
                return None
        return (ctypes.c_uint64 * NEWS_COUNT).from_address(words.value)

    def _submit(self, fn, req_id: str, job_id: int, keys, slots) -> None:
        blob, key_len, n = _keys_blob(keys, self.key_len)
        owner, address, n_slots = _int64_slots(slots)
        if n_slots != n:
            raise InvalidArgumentError(f"{n} keys but {n_slots} slots")
        with self._lock:
            rc = fn(
                self._h(), req_id.encode(), job_id, blob, key_len, n,
                address if n else None, self._err, _ERR_CAP,
            )
            del owner
            self._check(rc)

    def submit_load(self, req_id: str, job_id: int, keys, slots) -> None:
        """Pull keys from the request's source into rows ``slots``."""
        self._submit(self._lib.peerkv_submit_load, req_id, job_id, keys, slots)

    def submit_store(self, req_id: str, job_id: int, keys, slots) -> None:
        """Rows ``slots`` hold ``keys`` and stay pinned until the job is reported."""
        self._submit(self._lib.peerkv_submit_store, req_id, job_id, keys, slots)

    def get_finished(self) -> list[JobResult]:
        out: list[JobResult] = []
        with self._lock:
            while True:
                rc = self._lib.peerkv_get_finished(
                    self._h(), self._finished, _FINISHED_CAP, byref(self._count),
                    self._err, _ERR_CAP,
                )
                self._check(rc)
                n = self._count.value
                for r in self._finished[:n]:
                    out.append(
                        JobResult(r.job_id, bool(r.success), bool(r.is_load), r.bytes, r.seconds)
                    )
                if n < _FINISHED_CAP:
                    return out

    def request_finish(self, req_id: str) -> None:
        with self._lock:
            self._check(
                self._lib.peerkv_request_finish(self._h(), req_id.encode(), self._err, _ERR_CAP)
            )

    def on_schedule_end(self) -> None:
        with self._lock:
            self._check(self._lib.peerkv_on_schedule_end(self._h(), self._err, _ERR_CAP))

    # -- inbound lookups from remote consumers -------------------------

    def next_inbound(self) -> Inbound | None:
        """The next inbound work item, or None when nothing is queued."""
        with self._lock:
            while True:
                rc = self._lib.peerkv_next_inbound(
                    self._h(), byref(self._lookup_id), byref(self._kind), byref(self._first),
                    self._req_id_buf, len(self._req_id_buf), byref(self._needed),
                    self._keys_buf, len(self._keys_buf), byref(self._count),
                    self._err, _ERR_CAP,
                )
                if rc == _NO_WORK:
                    return None
                if rc == ERR_BUFFER_TOO_SMALL:
                    self._grow_inbound_buffers()
                    continue
                self._check(rc)
                return self._inbound_item()

    def _grow_inbound_buffers(self) -> None:
        if self.key_len <= 0:
            raise InvalidArgumentError("node created without key_len cannot take inbound keys")
        need_req = max(self._needed.value, len(self._req_id_buf))
        need_keys = self._count.value * self.key_len
        if need_req > len(self._req_id_buf):
            self._req_id_buf = ctypes.create_string_buffer(need_req)
        if need_keys > len(self._keys_buf):
            self._keys_buf = ctypes.create_string_buffer(need_keys)

    def _inbound_item(self) -> Inbound:
        n, key_len = self._count.value, self.key_len
        keys: list[bytes] = []
        if self._kind.value == INBOUND_EVALUATE and n:
            if key_len <= 0:
                raise InvalidArgumentError("node created without key_len cannot take inbound keys")
            raw = ctypes.string_at(self._keys_buf, n * key_len)
            keys = [raw[i : i + key_len] for i in range(0, n * key_len, key_len)]
        return Inbound(
            self._lookup_id.value,
            self._kind.value,
            bool(self._first.value),
            self._req_id_buf.value.decode("utf-8", "replace"),
            keys,
        )

    def answer_inbound(
        self, lookup_id: int, results: Sequence[int], pin_job_id: int = -1, pin_slots=()
    ) -> bool:
        """Answers an EVALUATE; True when the lookup is complete (no FINISH follows)."""
        codes = _result_codes(results)
        owner, address, n_pins = _int64_slots(pin_slots)
        with self._lock:
            rc = self._lib.peerkv_answer_inbound(
                self._h(), lookup_id, codes.buffer_info()[0] if len(codes) else None,
                len(codes), pin_job_id, address if n_pins else None, n_pins,
                byref(self._flag), self._err, _ERR_CAP,
            )
            del owner
            self._check(rc)
            return bool(self._flag.value)

    # -- state, stats, logs ----------------------------------------------

    def has_pending_work(self) -> bool:
        rc = self._lib.peerkv_has_pending_work(self._h())
        if rc < 0:
            raise error_for(rc, "peerkv_has_pending_work failed")
        return rc == 1

    def notify_fd(self) -> int:
        """The library's notification eventfd (see peerkv_notify_fd).

        Readable when there is something to collect; read its 8 bytes first
        (``os.read(fd, 8)``), then call get_finished and next_inbound until
        empty. Owned by the library: do not close it; it stays open across
        shutdown (which signals it) and is closed by destroy, so stop waiting
        on it before destroying.
        """
        with self._lock:
            rc = self._lib.peerkv_notify_fd(self._h(), self._err, _ERR_CAP)
            if rc < 0:
                raise self._error(rc)
            return rc

    def stats(self) -> dict[str, Any]:
        with self._lock:
            while True:
                rc = self._lib.peerkv_stats(
                    self._h(), self._stats_buf, len(self._stats_buf), byref(self._needed),
                    self._err, _ERR_CAP,
                )
                if rc == ERR_BUFFER_TOO_SMALL and self._needed.value > len(self._stats_buf):
                    self._stats_buf = ctypes.create_string_buffer(self._needed.value)
                    continue
                self._check(rc)
                doc = json.loads(self._stats_buf.value.decode())
                if isinstance(doc.get("peers"), list):
                    self._peers_seen, self._peers_seen_at = doc["peers"], time.monotonic()
                return doc

    def links(self) -> dict[str, dict[str, Any]]:
        """Each live peer's link, by peer id (docs/links.md): control round
        trips (rtt_p50_s, rtt_p99_s), session setup (setup_s), the fitted
        pull cost T(L) = pull_t0_s + L / pull_bytes_per_s with pull_samples
        and pull_age_s, throughput_bytes_per_s and failures by cause; with
        "path" (the data path) and "as_of_s" (how old the library's list is,
        at most about a second)."""
        self.stats()
        with self._lock:
            peers, at = self._peers_seen, self._peers_seen_at
        age = time.monotonic() - at
        out: dict[str, dict[str, Any]] = {}
        for entry in peers:
            if isinstance(entry, dict) and isinstance(entry.get("link"), dict):
                out[str(entry.get("peer"))] = {
                    **entry["link"], "path": entry.get("data_path", ""),
                    "handshaked": bool(entry.get("handshaked")), "as_of_s": age,
                }
        return out

    def take_logs(self) -> list[str]:
        """Pending library log lines, each "LEVEL message"."""
        lines: list[str] = []
        with self._lock:
            while True:
                rc = self._lib.peerkv_take_logs(
                    self._h(), self._log_buf, _LOG_CAP, byref(self._count)
                )
                self._check(rc)
                n = self._count.value
                if n == 0:
                    return lines
                text = ctypes.string_at(self._log_buf, n).decode("utf-8", "replace")
                lines.extend(line for line in text.split("\n") if line)
                if n < _LOG_CAP // 2:
                    return lines

    # -- lifecycle ------------------------------------------------------

    def _blocking(self, fn) -> None:
        err = ctypes.create_string_buffer(_ERR_CAP)
        rc = fn(self._h(), err, _ERR_CAP)
        if rc != OK:
            raise self._error(rc, err)

    def drain(self) -> None:
        """Waits (bounded by drain_timeout_s) for every submitted job to finish."""
        self._blocking(self._lib.peerkv_drain)

    def shutdown(self) -> None:
        """Fails unfinished jobs (still returned by get_finished) and closes sockets."""
        if self._handle:
            self._blocking(self._lib.peerkv_shutdown)

    def destroy(self) -> None:
        """Releases the handle; the region may be unmapped afterwards."""
        if not self._handle:
            return
        self._blocking(self._lib.peerkv_destroy)
        self._handle = 0
        self._region_owner = None
        _live_nodes.discard(self)

    close = destroy

    def __enter__(self) -> Node:
        return self

    def __exit__(self, *exc: object) -> None:
        self.destroy()

    def __del__(self) -> None:
        # In a forked child the Go runtime is dead: skip silently.
        if getattr(self, "_handle", 0) and _lib.usable_for_finalizer():
            try:
                self.destroy()
            except Exception:
                pass


_live_nodes: weakref.WeakSet[Node] = weakref.WeakSet()


@atexit.register
def _destroy_live_nodes() -> None:
    if not _lib.usable_for_finalizer():
        return
    for node in list(_live_nodes):
        try:
            node.destroy()
        except Exception:
            pass


def abi_version() -> tuple[int, int]:
    """(major, minor) implemented by the library (loads it)."""
    version = int(_lib.lib().peerkv_abi_version())
    return version >> 16, version & 0xFFFF


def version() -> str:
    buf = ctypes.create_string_buffer(256)
    _lib.lib().peerkv_version(buf, len(buf))
    return buf.value.decode()


def info() -> dict[str, Any]:
    """Host description: version, ABI, GPUs (via NVML), NIXL availability."""
    cdll = _lib.lib()
    if _lib.in_forked_child():
        raise _lib._fork_error()
    err = ctypes.create_string_buffer(_ERR_CAP)
    needed = c_size_t()
    buf = ctypes.create_string_buffer(4096)
    while True:
        rc = cdll.peerkv_info(buf, len(buf), byref(needed), err, _ERR_CAP)
        if rc == ERR_BUFFER_TOO_SMALL and needed.value > len(buf):
            buf = ctypes.create_string_buffer(needed.value)
            continue
        if rc != OK:
            raise error_for(rc, err.value.decode("utf-8", "replace"))
        return json.loads(buf.value.decode())

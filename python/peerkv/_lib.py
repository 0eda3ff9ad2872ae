"""Locating, loading and declaring libpeerkv.so.

The path is resolved at import; the library is loaded on first use only. A Go
runtime does not survive fork(), so the loading pid is recorded and every use
in a forked child raises PeerKVForkError (finalizers skip silently instead).
Nothing here knows the protocol: it only declares the C ABI of
include/peerkv.h.
"""

from __future__ import annotations

import ctypes
import os
import threading
from ctypes import (
    POINTER,
    c_char_p,
    c_double,
    c_int32,
    c_int64,
    c_size_t,
    c_uint32,
    c_uint64,
    c_void_p,
)
from pathlib import Path

from peerkv.errors import ABIMismatchError, LibraryLoadError, PeerKVForkError

ABI_MAJOR = 1
ABI_MINOR = 1  # the answer-caching calls and the news counts

LIBRARY_ENV = "PEERKV_LIBRARY"
LIBRARY_NAME = "libpeerkv.so"


class JobResultStruct(ctypes.Structure):
    """struct peerkv_job_result."""

    _fields_ = [
        ("job_id", c_int64),
        ("success", c_int32),
        ("is_load", c_int32),
        ("bytes", c_int64),
        ("seconds", c_double),
    ]


_p_size = POINTER(c_size_t)
_p_i32 = POINTER(c_int32)
_p_i64 = POINTER(c_int64)
_ERR = (c_void_p, c_size_t)  # char *err, size_t errlen

# name -> (restype, argtypes); every exported function of include/peerkv.h.
SIGNATURES: dict[str, tuple[type | None, tuple]] = {
    "peerkv_abi_version": (c_uint32, ()),
    "peerkv_version": (c_int32, (c_void_p, c_size_t)),
    "peerkv_info": (c_int32, (c_void_p, c_size_t, _p_size, *_ERR)),
    "peerkv_create": (
        c_int32,
        (c_uint32, c_void_p, c_uint64, c_uint64, c_char_p, _p_i64, *_ERR),
    ),
    "peerkv_request_start": (
        c_int32,
        (c_int64, c_char_p, c_char_p, _p_i32, *_ERR),
    ),
    "peerkv_lookup": (
        c_int32,
        (c_int64, c_char_p, c_void_p, c_size_t, c_size_t, c_void_p, *_ERR),
    ),
    "peerkv_on_schedule_end": (c_int32, (c_int64, *_ERR)),
    "peerkv_request_lookup_mode": (c_int32, (c_int64, c_char_p, _p_i32, *_ERR)),
    "peerkv_lookup_many": (
        c_int32,
        (c_int64, c_size_t, c_void_p, c_void_p, c_char_p, c_size_t, c_void_p, *_ERR),
    ),
    "peerkv_take_answers": (c_int32, (c_int64, c_void_p, c_size_t, _p_size, *_ERR)),
    "peerkv_news": (c_int32, (c_int64, POINTER(c_void_p), *_ERR)),
    "peerkv_probe": (c_int32, (c_int64, c_char_p, c_double, c_void_p, c_size_t, _p_size, *_ERR)),
    "peerkv_submit_load": (
        c_int32,
        (c_int64, c_char_p, c_int64, c_void_p, c_size_t, c_size_t, c_void_p, *_ERR),
    ),
    "peerkv_submit_store": (
        c_int32,
        (c_int64, c_char_p, c_int64, c_void_p, c_size_t, c_size_t, c_void_p, *_ERR),
    ),
    "peerkv_get_finished": (
        c_int32,
        (c_int64, c_void_p, c_size_t, _p_size, *_ERR),
    ),
    "peerkv_next_inbound": (
        c_int32,
        (
            c_int64,
            _p_i64,  # lookup_id
            _p_i32,  # kind
            _p_i32,  # first
            c_void_p,  # req_id_buf
            c_size_t,
            _p_size,  # req_id_needed
            c_void_p,  # keys_buf
            c_size_t,
            _p_size,  # n_keys
            *_ERR,
        ),
    ),
    "peerkv_answer_inbound": (
        c_int32,
        (
            c_int64,
            c_int64,  # lookup_id
            c_void_p,  # results
            c_size_t,
            c_int64,  # pin_job_id
            c_void_p,  # pin_slots
            c_size_t,
            _p_i32,  # finished
            *_ERR,
        ),
    ),
    "peerkv_request_finish": (c_int32, (c_int64, c_char_p, *_ERR)),
    "peerkv_has_pending_work": (c_int32, (c_int64,)),
    "peerkv_notify_fd": (c_int32, (c_int64, *_ERR)),
    "peerkv_drain": (c_int32, (c_int64, *_ERR)),
    "peerkv_stats": (c_int32, (c_int64, c_void_p, c_size_t, _p_size, *_ERR)),
    "peerkv_take_logs": (c_int32, (c_int64, c_void_p, c_size_t, _p_size)),
    "peerkv_shutdown": (c_int32, (c_int64, *_ERR)),
    "peerkv_destroy": (c_int32, (c_int64, *_ERR)),
}


# Calls that never take the node's state lock keep the GIL: releasing it
# costs more than they do (getting it back can wait a switch interval behind
# another thread). Every other call releases it: the lock can be held for a
# moment by the library's own threads (a data-path call under way), and a
# thread waiting for it while holding the GIL would stall the whole process.
KEEPS_GIL = frozenset({"peerkv_abi_version", "peerkv_version", "peerkv_take_logs", "peerkv_news"})


def library_path() -> Path:
    """Where the library is: $PEERKV_LIBRARY, else next to this package."""
    override = os.environ.get(LIBRARY_ENV)
    if override:
        return Path(override)
    return Path(__file__).resolve().parent / LIBRARY_NAME


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_loaded_pid: int | None = None
_forked = False


def _mark_forked() -> None:
    global _forked
    if _lib is not None:
        _forked = True


# Flags a child at fork time so the per-call check is a plain bool read.
os.register_at_fork(after_in_child=_mark_forked)


def is_loaded() -> bool:
    """True once this process (or a parent it forked from) loaded the library."""
    return _lib is not None


def in_forked_child() -> bool:
    """True in a child forked after the library was loaded: no call may run."""
    return _forked or (_loaded_pid is not None and _loaded_pid != os.getpid())


def _fork_error() -> PeerKVForkError:
    return PeerKVForkError(
        f"libpeerkv was loaded in pid {_loaded_pid}; pid {os.getpid()} is a "
        "forked child and cannot use it (the Go runtime does not survive fork). "
        "Load peerkv only after the process split, e.g. in a spawned process."
    )


def _configure_environment() -> None:
    if os.environ.get("LD_BIND_NOW"):
        raise LibraryLoadError(
            "LD_BIND_NOW is set: libpeerkv.so links go-nvml, whose NVML symbols "
            "stay unresolved until the NVIDIA driver is loaded, so immediate "
            "binding fails. Unset LD_BIND_NOW for processes that use peerkv."
        )
    # GOMAXPROCS is not set here: the library sizes its Go runtime itself
    # (go_max_procs; core/node/procs.go), and a variable set now would reach
    # only the processes vLLM starts later, never this Go runtime, which
    # reads the environment the process started with.
    # UCX (under NIXL) must not take over SIGSEGV from the Go runtime.
    os.environ.setdefault("UCX_HANDLE_ERRORS", "none")


def _declare(cdll: ctypes.CDLL, holding_gil: ctypes.PyDLL) -> None:
    for name, (restype, argtypes) in SIGNATURES.items():
        try:
            fn = getattr(holding_gil if name in KEEPS_GIL else cdll, name)
        except AttributeError as exc:
            raise LibraryLoadError(
                f"{cdll._name} does not export {name}: it was built from "
                "another version of include/peerkv.h"
            ) from exc
        fn.restype = restype
        fn.argtypes = argtypes
        setattr(cdll, name, fn)


def _check_abi(cdll: ctypes.CDLL) -> None:
    version = int(cdll.peerkv_abi_version())
    major, minor = version >> 16, version & 0xFFFF
    if major != ABI_MAJOR or minor < ABI_MINOR:
        raise ABIMismatchError(
            f"{cdll._name} implements peerkv ABI {major}.{minor}; this Python "
            f"package needs ABI {ABI_MAJOR}.{ABI_MINOR} or a later {ABI_MAJOR}.x"
        )


def lib() -> ctypes.CDLL:
    """The loaded library; loads it on the first call in this process."""
    global _lib, _loaded_pid
    if _lib is not None:
        if _forked or _loaded_pid != os.getpid():
            raise _fork_error()
        return _lib
    with _lock:
        if _lib is None:
            path = library_path()
            if not path.is_file():
                raise LibraryLoadError(
                    f"libpeerkv not found at {path}; build it with `make` and "
                    f"set {LIBRARY_ENV}, or install the peerkv wheel"
                )
            _configure_environment()
            try:
                cdll = ctypes.CDLL(str(path), mode=os.RTLD_LAZY)
                holding_gil = ctypes.PyDLL(str(path), mode=os.RTLD_LAZY)  # the same handle
            except OSError as exc:
                raise LibraryLoadError(f"cannot load {path}: {exc}") from exc
            _declare(cdll, holding_gil)
            _check_abi(cdll)
            _loaded_pid = os.getpid()
            _lib = cdll
    return _lib


def usable_for_finalizer() -> bool:
    """Whether a finalizer (__del__, atexit) may call into the library."""
    return _lib is not None and not in_forked_child()

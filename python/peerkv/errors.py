"""Exceptions raised by the peerkv binding, one class per C status code.

The numeric codes mirror the PEERKV_ERR_* #defines of include/peerkv.h
(tests/python/test_header_constants.py checks that they stay equal).
"""

from __future__ import annotations

import builtins

OK = 0
ERR_INVALID_ARGUMENT = -1
ERR_UNKNOWN_HANDLE = -2
ERR_BAD_PARAMS = -3
ERR_UNKNOWN_REQUEST = -4
ERR_BUFFER_TOO_SMALL = -5
ERR_TRANSPORT = -6
ERR_CLOSED = -7
ERR_FORKED = -8
ERR_INTERNAL = -9
ERR_TIMEOUT = -10
ERR_DUPLICATE = -11
ERR_UNAVAILABLE = -12
ERR_ABI_MISMATCH = -13


class PeerKVError(Exception):
    """A libpeerkv call failed. ``code`` is the PEERKV_ERR_* status."""

    code: int = 0

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code

    @property
    def message(self) -> str:
        return str(self.args[0]) if self.args else ""


class InvalidArgumentError(PeerKVError, ValueError):
    code = ERR_INVALID_ARGUMENT


class UnknownHandleError(PeerKVError):
    code = ERR_UNKNOWN_HANDLE


class BadParamsError(PeerKVError, ValueError):
    """Malformed or forbidden kv_transfer_params; the message names the problem."""

    code = ERR_BAD_PARAMS


class UnknownRequestError(PeerKVError):
    code = ERR_UNKNOWN_REQUEST


class BufferTooSmallError(PeerKVError):
    code = ERR_BUFFER_TOO_SMALL


class TransportError(PeerKVError, OSError):
    """Bind, listen or connect failed (e.g. the address is in use)."""

    code = ERR_TRANSPORT


class ClosedError(PeerKVError):
    code = ERR_CLOSED


class PeerKVForkError(PeerKVError):
    """The library was loaded in another process; this is a forked child.

    A Go runtime does not survive fork(): load peerkv after the process split
    (a spawned child), never before a fork that uses it.
    """

    code = ERR_FORKED


class InternalError(PeerKVError):
    """A panic was recovered inside the library; it is now poisoned."""

    code = ERR_INTERNAL


class PeerKVTimeoutError(PeerKVError, builtins.TimeoutError):
    code = ERR_TIMEOUT


class DuplicateError(PeerKVError):
    code = ERR_DUPLICATE


class UnavailableError(PeerKVError):
    """The feature is not available here (e.g. NIXL without its library)."""

    code = ERR_UNAVAILABLE


class ABIMismatchError(PeerKVError):
    code = ERR_ABI_MISMATCH


class LibraryLoadError(PeerKVError, OSError):
    """libpeerkv.so could not be found or loaded (not a library status code)."""


ERROR_CLASSES: dict[int, type[PeerKVError]] = {
    cls.code: cls
    for cls in (
        InvalidArgumentError,
        UnknownHandleError,
        BadParamsError,
        UnknownRequestError,
        BufferTooSmallError,
        TransportError,
        ClosedError,
        PeerKVForkError,
        InternalError,
        PeerKVTimeoutError,
        DuplicateError,
        UnavailableError,
        ABIMismatchError,
    )
}


def error_for(code: int, message: str) -> PeerKVError:
    """The exception for a negative status code and the library's message."""
    cls = ERROR_CLASSES.get(code)
    if cls is None:
        return PeerKVError(message or f"unknown peerkv status {code}", code)
    return cls(message or cls.__name__)

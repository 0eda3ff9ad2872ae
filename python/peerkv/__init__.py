"""peerkv: a peer-to-peer KV-cache tier for vLLM (Go core, ctypes binding).

Importing this package never loads libpeerkv.so; the library is loaded on the
first call that needs it (see peerkv._lib). The vLLM tier class lives in
peerkv.vllm and needs vLLM installed.

`Node` is this process's node (one libpeerkv handle); a *peer* is always a
remote node. `Peer` is Node's old name, kept as a deprecated alias.
"""

from peerkv._lib import LIBRARY_ENV, in_forked_child, is_loaded, library_path
from peerkv.errors import (
    ABIMismatchError,
    BadParamsError,
    BufferTooSmallError,
    ClosedError,
    DuplicateError,
    InternalError,
    InvalidArgumentError,
    LibraryLoadError,
    PeerKVError,
    PeerKVForkError,
    PeerKVTimeoutError,
    TransportError,
    UnavailableError,
    UnknownHandleError,
    UnknownRequestError,
)
from peerkv.node import (
    INBOUND_EVALUATE,
    INBOUND_FINISH,
    LOOKUP_HIT,
    LOOKUP_HIT_PENDING,
    LOOKUP_MISS,
    LOOKUP_RETRY,
    POLICY_BLOCK_LEVEL,
    POLICY_REQUEST_LEVEL,
    Inbound,
    JobResult,
    Node,
    abi_version,
    info,
    version,
)

from peerkv._version import __version__


def __getattr__(name: str) -> type[Node]:
    if name == "Peer":  # Node's old name (see peerkv.peer)
        import warnings

        from peerkv.peer import PEER_DEPRECATED

        warnings.warn(PEER_DEPRECATED, DeprecationWarning, stacklevel=2)
        return Node
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ABIMismatchError",
    "BadParamsError",
    "BufferTooSmallError",
    "ClosedError",
    "DuplicateError",
    "INBOUND_EVALUATE",
    "INBOUND_FINISH",
    "Inbound",
    "InternalError",
    "InvalidArgumentError",
    "JobResult",
    "LIBRARY_ENV",
    "LOOKUP_HIT",
    "LOOKUP_HIT_PENDING",
    "LOOKUP_MISS",
    "LOOKUP_RETRY",
    "LibraryLoadError",
    "POLICY_BLOCK_LEVEL",
    "Node",
    "POLICY_REQUEST_LEVEL",
    "PeerKVError",
    "PeerKVForkError",
    "PeerKVTimeoutError",
    "TransportError",
    "UnavailableError",
    "UnknownHandleError",
    "UnknownRequestError",
    "abi_version",
    "in_forked_child",
    "info",
    "is_loaded",
    "library_path",
    "version",
]

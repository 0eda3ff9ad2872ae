"""Deprecated: the old name of `peerkv.node`.

A *peer* is always a remote node; the local side is the *node*. `Peer` (this
module's and `peerkv.Peer`) is `peerkv.node.Node` under its old name, kept so
existing hosts keep working; it warns with DeprecationWarning. Every other
name here is the same object as in `peerkv.node`.
"""

from __future__ import annotations

import warnings
from typing import Any

from peerkv import node as _node

PEER_DEPRECATED = (
    "peerkv.Peer is deprecated: use peerkv.Node (the local node; a peer is always a remote node)"
)


def __getattr__(name: str) -> Any:
    if name == "Peer":
        warnings.warn(PEER_DEPRECATED, DeprecationWarning, stacklevel=2)
        return _node.Node
    try:
        return getattr(_node, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None

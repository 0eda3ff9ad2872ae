"""The local side is the node: `peerkv.Node`. `Peer`, its old name, keeps
working as a deprecated alias (a peer is always a remote node)."""

import importlib
import warnings

import pytest

import peerkv
import peerkv.node


def test_the_node_class_is_exported_as_node():
    assert peerkv.Node is peerkv.node.Node
    assert "Node" in peerkv.__all__
    assert "Peer" not in peerkv.__all__, "a star import must not pull in the deprecated name"


def test_peer_is_a_deprecated_alias_of_node():
    with pytest.deprecated_call(match="use peerkv.Node"):
        assert peerkv.Peer is peerkv.Node
    with pytest.deprecated_call(match="use peerkv.Node"):
        from peerkv import Peer
    assert Peer is peerkv.Node


def test_the_old_module_still_serves_every_name():
    old = importlib.import_module("peerkv.peer")
    with pytest.deprecated_call(match="use peerkv.Node"):
        from peerkv.peer import Peer
    assert Peer is peerkv.Node
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # only Peer itself warns
        for name in ("LOOKUPS_ASK", "NEWS_RESULTS", "AnswerChange", "Inbound", "JobResult", "_parse_answers"):
            assert getattr(old, name) is getattr(peerkv.node, name), name
    with pytest.raises(AttributeError, match="peerkv.peer"):
        old.no_such_name  # noqa: B018


def test_other_missing_names_still_raise():
    with pytest.raises(AttributeError, match="no_such_name"):
        peerkv.no_such_name  # noqa: B018

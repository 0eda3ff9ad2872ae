"""Every --kv-transfer-config in README.md and docs/ builds peerkv's tier.

The snippets are read from the docs themselves (any fenced block holding
`--kv-transfer-config '...'`), so a doc edit is checked by the next run.
Each one goes through `peerkv check-config` as written (--elsewhere: its
addresses are other machines'), and then, with this machine's substitutions
(loopback host, free control and data ports, a small primary tier, a secret file that
exists), through check-config on this machine and through vLLM's real
OffloadingSpecFactory -> TieringOffloadingSpec -> manager in a node process,
which must hold a PeerKVTier. A snippet that cannot run here (elided with
"...") carries `<!-- not runnable here: why -->` on the line before its fence;
those are listed, and a marked snippet that does run fails the test.
"""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO
from peerkv_node import PRIMARY_BYTES, NodeError, NodeProcess, control_port

DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
_FENCE = re.compile(r"^\s*(```|~~~)")
_CONFIG = re.compile(r"--kv-transfer-config[= ]+'([^']*)'", re.S)
_NOT_RUNNABLE = re.compile(r"<!--\s*not runnable here:\s*(.*?)\s*-->")


@dataclass
class Snippet:
    where: str  # "docs/guide.md:21"
    text: str
    not_runnable: str | None  # the doc's reason, when marked

    def __str__(self) -> str:
        return self.where


def _snippets() -> list[Snippet]:
    found = []
    for path in DOCS:
        lines = path.read_text().splitlines()
        i = 0
        while i < len(lines):
            if not _FENCE.match(lines[i]):
                i += 1
                continue
            mark = _NOT_RUNNABLE.search(lines[i - 1]) if i else None
            start = i
            i += 1
            while i < len(lines) and not _FENCE.match(lines[i]):
                i += 1
            block = "\n".join(lines[start + 1 : i])
            for m in _CONFIG.finditer(block):
                line = start + 2 + block[: m.start()].count("\n")
                text = m.group(1).replace("\\\n", "\n")
                found.append(Snippet(f"{path.relative_to(REPO)}:{line}", text, mark.group(1) if mark else None))
            i += 1
    return found


SNIPPETS = _snippets()
RUNNABLE = [s for s in SNIPPETS if s.not_runnable is None]


def _check_config(*args: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_P2P_", "PEERKV_AUTH"))}
    return subprocess.run(
        [sys.executable, "-m", "peerkv", "check-config", *args], capture_output=True, text=True, timeout=60,
        env=dict(environ, PYTHONPATH=str(REPO / "python")),
    )


def _offloading_connectors(doc: dict) -> list[dict]:
    """The OffloadingConnector configs of a kv-transfer-config: itself, or
    a MultiConnector's children (vLLM builds each child from its own dict)."""
    if doc.get("kv_connector") == "MultiConnector":
        children = doc.get("kv_connector_extra_config", {}).get("connectors", [])
        return [c for c in children if c.get("kv_connector") == "OffloadingConnector"]
    return [doc]


def _for_this_machine(doc: dict, secret_file: Path) -> dict:
    """The snippet as it would run here: the suite's CPU substitutions."""
    doc = copy.deepcopy(doc)
    for connector in _offloading_connectors(doc):
        extra = connector.get("kv_connector_extra_config") or {}
        if "cpu_bytes_to_use" in extra:
            extra["cpu_bytes_to_use"] = PRIMARY_BYTES
        for tier in extra.get("secondary_tiers") or []:
            for key in ("host", "data_host", "advertise_host"):
                if key in tier:
                    tier[key] = "127.0.0.1"
            tier["port"] = control_port()
            if "data_port" in tier:  # a fixed one, as a NetworkPolicy needs, would collide here
                tier["data_port"] = control_port()
            else:
                tier["data_port"] = 0  # the default, port + 1000, is not known to be free here
            if "auth_secret_file" in tier:
                tier["auth_secret_file"] = str(secret_file)
    return doc


def test_the_docs_hold_kv_transfer_configs():
    assert len(RUNNABLE) >= 3, [str(s) for s in SNIPPETS]
    assert any(s.where.startswith("docs/guide.md") for s in RUNNABLE), "the guide's vllm serve line is not found"


def test_snippets_that_cannot_run_here_are_marked_and_listed():
    """A snippet that is not JSON (elided) must be marked in its doc; a marked
    one must really be unrunnable, or the mark hides a snippet from this test."""
    for snippet in SNIPPETS:
        try:
            json.loads(snippet.text)
            parses = True
        except ValueError:
            parses = False
        if snippet.not_runnable is None:
            assert parses, f"{snippet}: not JSON; fix it or mark it <!-- not runnable here: why -->"
        else:
            assert not parses, f"{snippet}: marked not runnable, but it is JSON: remove the mark"
    listed = [f"{s}: {s.not_runnable}" for s in SNIPPETS if s.not_runnable]
    print("snippets not runnable here:", *listed, sep="\n  ")


@pytest.mark.parametrize("snippet", RUNNABLE, ids=str)
def test_check_config_accepts_the_snippet_as_written(snippet):
    out = _check_config("--elsewhere", snippet.text)
    assert out.returncode == 0, f"{snippet}:\n{out.stdout}{out.stderr}"
    assert out.stdout.rstrip().endswith(": ok"), out.stdout


@pytest.fixture(scope="module")
def node(library):
    process = NodeProcess()
    try:
        yield process.ready()
    finally:
        process.close()


@pytest.mark.parametrize("snippet", RUNNABLE, ids=str)
def test_vllms_factory_builds_peerkvs_tier_from_the_snippet(snippet, node, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text("a-cluster-secret\n")
    secret.chmod(0o600)
    doc = _for_this_machine(json.loads(snippet.text), secret)
    connectors = _offloading_connectors(doc)
    assert connectors, f"{snippet}: no OffloadingConnector"
    for i, connector in enumerate(connectors):
        name = f"{snippet.where}#{i}"
        try:
            info = node.call("add", name, connector, timeout=120)
        except NodeError as exc:
            pytest.fail(f"{snippet}: vLLM's OffloadingSpecFactory built no peerkv tier from it: {exc}")
        assert info["tier_class"] == "PeerKVTier", (snippet, info)
        node.call("shutdown", name)
    out = _check_config("--single-host", json.dumps(doc))  # on the machine it runs on, all checks
    assert out.returncode == 0, f"{snippet} (for this machine):\n{out.stdout}{out.stderr}"

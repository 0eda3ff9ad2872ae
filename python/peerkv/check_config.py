"""Check peerkv's tier configuration before starting vLLM.

vLLM builds the tier, and so checks its configuration, only in EngineCore
after the model has loaded. This checks it at once, against the same schema
(peerkv.config), without loading libpeerkv.so or importing vLLM. CONFIG is
the JSON given to `vllm serve --kv-transfer-config` (or one secondary_tiers
entry), inline or as @FILE; every peerkv tier in it is checked. Exit status
0: all good; 2: a problem, each printed with its key.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

HELP = "check the peerkv tier of a --kv-transfer-config without starting vLLM"
EPILOG = """examples:
  peerkv check-config '{"kv_connector":"OffloadingConnector","kv_role":"kv_both",
      "kv_connector_extra_config":{"secondary_tiers":[{"type":"peerkv","port":5710}]}}'
  peerkv check-config @kv-transfer-config.json
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG", help="JSON, or @FILE holding it")


def peerkv_tiers(doc: Any) -> list[tuple[str, Any]]:
    """(where, tier) for each peerkv tier in a kv-transfer-config, a list of
    tiers, or one tier."""
    if isinstance(doc, dict) and "kv_connector_extra_config" in doc:
        extra = doc.get("kv_connector_extra_config") or {}
        doc = extra.get("secondary_tiers", []) if isinstance(extra, dict) else []
        where = "kv_connector_extra_config.secondary_tiers[{}]"
    elif isinstance(doc, list):
        where = "secondary_tiers[{}]"
    else:
        return [("the tier", doc)]
    found = []
    for i, tier in enumerate(doc if isinstance(doc, list) else []):
        if isinstance(tier, dict) and (
            tier.get("type") == "peerkv" or str(tier.get("module_path", "")).startswith("peerkv")
        ):
            found.append((where.format(i), tier))
    return found


def run(args: argparse.Namespace) -> int:
    from peerkv import config

    text = args.config
    try:
        if text.startswith("@"):
            text = Path(text[1:]).read_text()
        doc = json.loads(text)
    except (OSError, ValueError) as exc:
        print(f"peerkv check-config: cannot read CONFIG: {exc}", file=sys.stderr)
        return 2
    tiers = peerkv_tiers(doc)
    if not tiers:
        print('peerkv check-config: no peerkv tier (a secondary_tiers entry with "type": "peerkv")', file=sys.stderr)
        return 2
    status = 0
    for where, tier in tiers:
        try:
            warnings = config.check_tier_config(tier)
        except config.PeerKVConfigError as exc:
            status = 2
            for problem in exc.problems:
                print(f"{where}: {problem}")
            continue
        for line in warnings:
            print(f"{where}: warning: {line}")
        print(f"{where}: ok")
    return status

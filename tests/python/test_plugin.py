"""The vllm.general_plugins entry point registers "type": "peerkv" with
vLLM's SecondaryTierFactory; the module_path form keeps working. Each check
runs in a fresh interpreter (the factory's registry is process-wide), under
the vLLM of the Python running the tests (make test-vllm032 runs them under
0.32 too)."""

import json
import os
import subprocess
import sys
import textwrap

from conftest import REPO

def _run(code, extra_path=None, timeout=180):
    # At call time: the library fixture exports PEERKV_LIBRARY.
    env = dict(os.environ, PYTHONPATH=str(REPO / "python") + os.pathsep + str(REPO / "tests" / "python"))
    if extra_path:
        env["PYTHONPATH"] = str(extra_path) + os.pathsep + env["PYTHONPATH"]
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         timeout=timeout, env=env)
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_register_makes_the_short_type_resolve():
    got = _run("""
        import json
        import peerkv
        from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
        before = "peerkv" in SecondaryTierFactory._registry
        from peerkv.vllm_plugin import register
        first, second = register(), register()  # vLLM may load plugins more than once
        cls = SecondaryTierFactory.get_tier_class({"type": "peerkv"})
        import peerkv.vllm
        print(json.dumps({"before": before, "first": first, "second": second,
                          "is_tier": cls is peerkv.vllm.PeerKVTier, "loaded": peerkv.is_loaded()}))
    """)
    assert got == {"before": False, "first": True, "second": True, "is_tier": True, "loaded": False}


def test_the_module_path_form_still_resolves():
    got = _run("""
        import json
        import peerkv.vllm
        from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
        cls = SecondaryTierFactory.get_tier_class({"type": "PeerKVTier", "module_path": "peerkv.vllm"})
        print(json.dumps({"is_tier": cls is peerkv.vllm.PeerKVTier}))
    """)
    assert got == {"is_tier": True}


def test_vllms_plugin_loader_runs_the_entry_point(tmp_path):
    """The line handed to packaging, installed as a distribution's metadata,
    and loaded the way vLLM loads general plugins in every process."""
    dist = tmp_path / "peerkv_entrypoint_probe-0.0.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: peerkv-entrypoint-probe\nVersion: 0.0.0\n")
    (dist / "entry_points.txt").write_text("[vllm.general_plugins]\npeerkv = peerkv.vllm_plugin:register\n")
    got = _run("""
        import json, logging
        from vllm.plugins import load_general_plugins
        from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
        records = []
        class Keep(logging.Handler):
            def emit(self, record):
                records.append(record.getMessage())
        logging.getLogger("vllm").addHandler(Keep())
        load_general_plugins()
        cls = SecondaryTierFactory.get_tier_class({"type": "peerkv"})
        print(json.dumps({"name": cls.__name__, "module": cls.__module__,
                          "out_of_tree_warning": any("out-of-tree" in r for r in records)}))
    """, extra_path=tmp_path)
    assert got == {"name": "PeerKVTier", "module": "peerkv.vllm", "out_of_tree_warning": False}


def test_a_tiering_spec_builds_the_tier_from_the_short_form(library):
    """vLLM's own TieringOffloadingSpec, given {"type": "peerkv"} and no
    module_path, builds a PeerKVTier whose tier_type is "peerkv"."""
    got = _run("""
        import json
        from peerkv.vllm_plugin import register
        register()
        from peerkv_node import _build_manager, control_port, kv_transfer_config
        config = kv_transfer_config(control_port())
        tier = config["kv_connector_extra_config"]["secondary_tiers"][0]
        tier["type"] = "peerkv"
        del tier["module_path"]
        manager = _build_manager(config)
        built = manager.secondary_tiers[0]
        out = {"class": type(built).__name__, "tier_type": built.tier_type}
        manager.shutdown()
        print(json.dumps(out))
    """)
    assert got == {"class": "PeerKVTier", "tier_type": "peerkv"}


def test_register_never_raises_without_vllm():
    got = _run("""
        import builtins, json
        real_import = builtins.__import__
        def no_vllm(name, *args, **kwargs):
            if name.startswith("vllm"):
                raise ImportError("no vLLM here")
            return real_import(name, *args, **kwargs)
        builtins.__import__ = no_vllm
        from peerkv.vllm_plugin import register
        print(json.dumps({"registered": register()}))
    """)
    assert got == {"registered": False}

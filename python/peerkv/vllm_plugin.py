"""vLLM general plugin: registers peerkv's tier as ``"type": "peerkv"``.

Installed as the ``vllm.general_plugins`` entry point ``peerkv``
(``peerkv = peerkv.vllm_plugin:register``). vLLM runs general plugins in
every process it starts (API server, EngineCore, workers) before it builds
the connector, so this tier entry needs no ``module_path``:

    "secondary_tiers": [{"type": "peerkv", "host": "10.0.0.1", "port": 5710}]

Registering is cheap: it imports vLLM's tier factory and records a loader;
neither peerkv.vllm nor libpeerkv.so is loaded until vLLM builds the tier.
The ``module_path`` form (``"type": "PeerKVTier", "module_path":
"peerkv.vllm"``) keeps working without the entry point.
"""

from __future__ import annotations

import logging

TIER_TYPE = "peerkv"
MODULE = "peerkv.vllm"
CLASS = "PeerKVTier"

_log = logging.getLogger("vllm.peerkv")


def register() -> bool:
    """Registers the tier type with vLLM's SecondaryTierFactory; True when
    "peerkv" resolves to PeerKVTier afterwards. Safe to call any number of
    times, in any process, and it never raises: vLLM calls general plugins
    without a guard, so an exception here would stop vLLM from starting."""
    try:
        from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
    except Exception as exc:  # a vLLM without the tiering API, or none at all
        _log.debug("peerkv: not registering the %r tier type: %s", TIER_TYPE, exc)
        return False
    try:
        SecondaryTierFactory.register_tier(TIER_TYPE, MODULE, CLASS)
    except ValueError:
        pass  # registered already (this process loaded the plugins before)
    except Exception as exc:
        _log.warning("peerkv: could not register the %r tier type: %s", TIER_TYPE, exc)
        return False
    return True

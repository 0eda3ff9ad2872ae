"""`make gpu-check`: TTFT of a pulled prefix against the same prompt
recomputed, peerkv against vLLM's own "p2p" tier, two real vLLM engines per
tier sharing one NVIDIA GPU, rows over NIXL.

One prepared run for a one-GPU machine with no network (docs/benchmarks.md,
"On a GPU"): the tiny model is generated on the spot (tests/engine/tiny_model.py),
engines start with the interpreter running this script (its vLLM, torch and
NIXL), and the whole run has a deadline (--budget-s, 8 minutes).

For each tier, a pair of engines (source, consumer), one pair at a time; for
each prefix size and repeat, a fresh prompt of that many random token ids plus
a short tail:
  1. the source computes it;
  2. the consumer answers it with `remote_kv_source` naming the source
     (the pull; must reuse every full block of the prefix);
  3. the consumer answers the same prompt under a `cache_salt` of its own,
     which changes every block hash: nothing cached, nothing to pull
     (the recompute);
  4. the consumer answers the salted prompt again, from the KV it computed
     in 3: the tail over a cached prefix, the computation a consumer runs
     after a pull, and the reference the pulled output must equal token for
     token (engines.rerun_from_cache says why not the from-scratch output).
peerkv's data path for each pull is read from the consumer's
`vllm:peerkv_data_path_loads_total{path}`; its tier is set to
`data_transport: "nixl"`, and vLLM's tier moves rows over NIXL only.

`--device cpu` runs the same code with vLLM's CPU build (.venv-engine) and
short prefixes: `make test-engine` runs it so this script cannot rot.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "engine"))

import engines  # noqa: E402
import tiny_model  # noqa: E402

BLOCK = engines.BLOCK_SIZE
# Tokens after the prefix: the prompt's last, partial block is computed by
# the consumer in every run, so the prefix's full blocks are all it can pull.
TAIL_TOKENS = 16
OUTPUT_TOKENS = 8
# Random prompt ids: past <s> and </s> (0, 1), inside the tiny vocabulary.
PROMPT_IDS = range(2, tiny_model.VOCAB_SIZE)
WARMUP_TOKENS = 512
GPU_MEMORY_UTILIZATION = 0.25  # each of two engines on one GPU
LOGS = REPO / "build" / "gpu-check"


class CheckFailed(Exception):
    """What the run found wrong, for the operator: printed, exit 1."""


class Deadline:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.start = time.monotonic()

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.start)

    def check(self, doing: str) -> None:
        if self.left() <= 0:
            raise CheckFailed(f"over the {self.seconds:.0f} s budget before {doing}")


# -- the machine ------------------------------------------------------------

TORCH_PROBE = """
import json, torch
gpus = []
if torch.cuda.is_available():
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
print(json.dumps({"torch": torch.__version__, "cuda_build": torch.version.cuda, "gpus": gpus}))
"""

STACK_PROBE = """
import json
out = {}
try:
    import nixl  # noqa: F401
    out["nixl"] = True
except Exception as e:
    out["nixl"] = f"{type(e).__name__}: {e}"
import vllm
out["vllm"] = vllm.__version__
print(json.dumps(out))
"""


def _probe(code: str, what: str) -> dict:
    """Runs code in this interpreter's environment, in a process of its own
    (the check itself holds no CUDA context)."""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise CheckFailed(f"{sys.executable} cannot import {what}:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def probe_machine(device: str) -> dict:
    """What the engines will run on; for cuda, fails naming what is missing."""
    python = sys.executable
    found = _probe(TORCH_PROBE, "torch")
    if device == "cuda":
        missing = []
        smi = shutil.which("nvidia-smi")
        if smi is None:
            missing.append("nvidia-smi is not on PATH (no NVIDIA driver installed?)")
        else:
            listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60)
            if listed.returncode != 0 or "GPU" not in listed.stdout:
                missing.append(f"`nvidia-smi -L` lists no GPU: {(listed.stdout + listed.stderr).strip()[:300]}")
        if not found["cuda_build"]:
            missing.append(f"torch {found['torch']} in {python} is a CPU-only build (vLLM's CUDA build is needed)")
        elif not found["gpus"]:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            missing.append(f"torch {found['torch']} (CUDA {found['cuda_build']}) in {python} sees no CUDA device"
                           + (f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""))
        if missing:
            raise CheckFailed("no NVIDIA GPU visible: " + "; ".join(missing))
        found["device"] = found["gpus"][0]
    else:
        found["device"] = "CPU (vLLM's CPU build)"
    found.update(_probe(STACK_PROBE, "vllm"))
    if found["nixl"] is not True:
        raise CheckFailed(f"NIXL does not import in {python} ({found['nixl']}): both tiers pull over NIXL here")
    return found


# -- engines ----------------------------------------------------------------

class CheckEngine(engines.Engine):
    """An engine of tests/engine run by this interpreter, on `device`."""

    device: str = "cpu"
    max_positions: int = tiny_model.MAX_POSITIONS

    def kv_transfer_config(self):
        config = super().kv_transfer_config()
        if self.device == "cuda":
            # vLLM's own spec: its worker copies between the GPU and the region.
            extra = config["kv_connector_extra_config"]
            extra["spec_name"] = "TieringOffloadingSpec"
            del extra["spec_module_path"]
        return config

    def command(self):
        cmd = super().command()
        cmd += ["--hf-overrides", json.dumps({"max_position_embeddings": self.max_positions})]
        if self.device == "cuda":
            # vLLM's own chunk size for the GPU, not the CPU suite's 4096.
            at = cmd.index("--max-num-batched-tokens")
            del cmd[at : at + 2]
            cmd += ["--gpu-memory-utilization", str(GPU_MEMORY_UTILIZATION)]
        return cmd

    def environment(self):
        env = super().environment()
        if self.device == "cuda":
            for name in ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND"):
                env.pop(name, None)
        return env


def make_pair(tier: str, device: str, model: Path, max_len: int, cpu_bytes: int) -> list[CheckEngine]:
    names = {"peerkv": ("A", "B"), "p2p": ("S1", "S2")}[tier]
    # Force NIXL: two peerkv engines on one host would otherwise use the same-host copy.
    options = {"data_transport": "nixl"} if tier == "peerkv" else {}
    pair = []
    for i, name in enumerate(names):
        e = CheckEngine(name, model, LOGS, tier=tier, core=engines.core_for(i) if device == "cpu" else None,
                        max_model_len=max_len, cpu_bytes=cpu_bytes, tier_options=dict(options))
        e.device = device
        e.max_positions = max(max_len, tiny_model.MAX_POSITIONS)
        pair.append(e)
    return pair


def check_shm(pair_bytes: int) -> None:
    """Each engine's offload region is a /dev/shm file: a container's small
    default /dev/shm would end an engine with SIGBUS mid-run."""
    st = os.statvfs("/dev/shm")
    free = st.f_bavail * st.f_frsize
    if free < pair_bytes:
        raise CheckFailed(f"/dev/shm has {free >> 20} MiB free, the two engines' offload regions need "
                          f"{pair_bytes >> 20} MiB (a container: --shm-size)")


def start_pair(pair: list[CheckEngine], device: str, deadline: Deadline) -> None:
    if device == "cuda":
        # One at a time: an engine measures the GPU memory it may take while
        # it starts, and a neighbour allocating meanwhile would skew that.
        for engine in pair:
            engines.start_all([engine], timeout=max(30.0, deadline.left()))
    else:
        engines.start_all(pair, timeout=max(30.0, deadline.left()))


# -- one measurement --------------------------------------------------------

_LABELLED = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)\{(?P<labels>[^}]*)\}\s+(?P<value>\S+)')


def loads_by_path(engine: engines.Engine) -> dict[str, float]:
    """peerkv's fetch rounds per data path, as the consumer reports them."""
    status, body = engine._request("GET", "/metrics", None, timeout=30)
    if status != 200:
        raise CheckFailed(f"GET /metrics on {engine.name}: HTTP {status}")
    out: dict[str, float] = {}
    for line in body.decode().splitlines():
        m = _LABELLED.match(line)
        if m and m["name"] == "vllm:peerkv_data_path_loads_total":
            path = re.search(r'path="([^"]*)"', m["labels"])
            if path:
                out[path[1]] = out.get(path[1], 0.0) + float(m["value"])
    return out


def random_prompt(prefix_tokens: int) -> list[int]:
    rng = random.Random(uuid.uuid4().int)
    return [rng.choice(PROMPT_IDS) for _ in range(prefix_tokens + TAIL_TOKENS)]


def one_pull(tier: str, source, consumer, prefix_tokens: int, deadline: Deadline) -> dict:
    prompt = random_prompt(prefix_tokens)
    full_blocks = len(prompt) // BLOCK * BLOCK
    # Each request may take what is left of the budget (a 32K prefill on a
    # loaded CPU takes minutes), and not longer.
    wait = max(30.0, deadline.left())
    source.complete(prompt, max_tokens=1, timeout=wait)
    before = loads_by_path(consumer) if tier == "peerkv" else {}
    params = {"remote_kv_source": {"kv_request_id": f"gpu-check-{uuid.uuid4().hex}", **source.kv_endpoint}}
    pulled = engines.stream_completion(consumer.url, prompt, max_tokens=OUTPUT_TOKENS, timeout=wait,
                                       kv_transfer_params=params)
    if pulled["cached_tokens"] != full_blocks:
        raise CheckFailed(f"{tier}: {consumer.name} reused {pulled['cached_tokens']} of {len(prompt)} prompt tokens "
                          f"from {source.name}, expected {full_blocks} (engine logs in {LOGS.relative_to(REPO)}/)")
    salt = f"recompute-{uuid.uuid4().hex}"
    recomputed = engines.stream_completion(consumer.url, prompt, max_tokens=OUTPUT_TOKENS, timeout=wait,
                                           cache_salt=salt)
    if recomputed["cached_tokens"] != 0:
        raise CheckFailed(f"{tier}: the salted recompute reused {recomputed['cached_tokens']} tokens")
    reference = engines.rerun_from_cache(consumer, prompt, max_tokens=OUTPUT_TOKENS, timeout=wait, cache_salt=salt)
    if pulled["token_ids"] != engines.token_ids(reference):
        raise CheckFailed(f"{tier}, {prefix_tokens}-token prefix: the output over pulled KV "
                          f"{pulled['token_ids']} differs from the output over recomputed KV "
                          f"{engines.token_ids(reference)}")
    if tier == "peerkv":
        after = loads_by_path(consumer)
        used = sorted(p for p in after if after[p] > before.get(p, 0.0))
        if used != ["nixl"]:
            raise CheckFailed(f"peerkv pulled over {used or 'no data path'}, not NIXL alone "
                              f"(vllm:peerkv_data_path_loads_total on {consumer.name}: {after})")
        path = "nixl"
    else:
        path = "nixl"  # vLLM's p2p tier has no other data path
    return {"pull": pulled["ttft_s"], "recompute": recomputed["ttft_s"], "path": path,
            "scratch_same": recomputed["token_ids"] == pulled["token_ids"]}


def measure_tier(tier, pair, sizes, repeat, deadline) -> dict:
    source, consumer = pair
    deadline.check(f"the {tier} warm-up pull")
    # The first pull opens the pair's session (handshake, NIXL registration):
    # timed on its own, outside the table.
    first = one_pull(tier, source, consumer, WARMUP_TOKENS, deadline)["pull"]
    print(f"gpu-check: {tier}: first pull of the session ({WARMUP_TOKENS} tokens) {first * 1e3:.0f} ms", flush=True)
    rows = {}
    for n in sizes:
        runs = []
        for _ in range(repeat):
            deadline.check(f"the {tier} {n}-token pull")
            runs.append(one_pull(tier, source, consumer, n, deadline))
        rows[n] = {
            "pull": statistics.median(r["pull"] for r in runs),
            "recompute": statistics.median(r["recompute"] for r in runs),
            "paths": sorted({r["path"] for r in runs}),
            "scratch_same": sum(r["scratch_same"] for r in runs),
            "runs": len(runs),
        }
        print(f"gpu-check: {tier}: {n} tokens: pulls "
              + ", ".join(f"{r['pull'] * 1e3:.1f}" for r in runs) + " ms; recomputes "
              + ", ".join(f"{r['recompute'] * 1e3:.1f}" for r in runs) + " ms", flush=True)
    return rows


# -- the run ----------------------------------------------------------------

def print_table(found: dict, results: dict, sizes: list[int], repeat: int) -> None:
    ours, theirs = results["peerkv"], results["p2p"]
    print()
    print(f"gpu-check on {found['device']}: vLLM {found['vllm']}, torch {found['torch']}, tiny model "
          f"(block {BLOCK}); TTFT median of {repeat} (ms); speedup = recompute / pull, same run")
    print(f"{'prefix':>7} | {'peerkv pull':>11} {'recompute':>9} {'speedup':>7} | {'vLLM p2p pull':>13} "
          f"{'recompute':>9} {'speedup':>7} | {'peerkv/p2p pull':>15} | {'rows over':>11} | output")
    for n in sizes:
        o, t = ours[n], theirs[n]
        paths = "+".join(o["paths"]) + " / " + "+".join(t["paths"])
        print(f"{n:>7} | {o['pull'] * 1e3:>11.1f} {o['recompute'] * 1e3:>9.1f} {o['recompute'] / o['pull']:>6.2f}x | "
              f"{t['pull'] * 1e3:>13.1f} {t['recompute'] * 1e3:>9.1f} {t['recompute'] / t['pull']:>6.2f}x | "
              f"{o['pull'] / t['pull']:>14.2f}x | {paths:>11} | identical")
    same = sum(r["scratch_same"] for tier in results.values() for r in tier.values())
    runs = sum(r["runs"] for tier in results.values() for r in tier.values())
    print(f"(output: pulled == recomputed, greedy {OUTPUT_TOKENS} tokens, every run; the from-scratch recompute's "
          f"own tokens matched in {same} of {runs})")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--prefix-tokens", default="8192,32768", help="prefix sizes, comma-separated")
    ap.add_argument("--repeat", type=int, default=3, help="pulls per size and tier (medians are printed)")
    ap.add_argument("--budget-s", type=float, help="fail past this many seconds (default: 8 min on cuda; "
                    "20 min on cpu, where engines start in minutes on a loaded 2-core machine)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.prefix_tokens.split(",")]
    if any(n < BLOCK or n % BLOCK for n in sizes) or args.repeat < 1:
        ap.error(f"--prefix-tokens takes multiples of the block size {BLOCK}; --repeat at least 1")
    deadline = Deadline(args.budget_s or (480.0 if args.device == "cuda" else 1200.0))
    try:
        found = probe_machine(args.device)
        print(f"gpu-check: {found['device']}, vLLM {found['vllm']}, torch {found['torch']}, NIXL imports", flush=True)
        engines.ENGINE_PYTHON = Path(sys.executable)
        engines.library_path()
        LOGS.mkdir(parents=True, exist_ok=True)
        model = tiny_model.build(REPO / ".cache" / "engine-model")
        # Room for the longest prompt and its output, in whole KiB of positions.
        max_len = -(-(max(sizes) + TAIL_TOKENS + OUTPUT_TOKENS) // 1024) * 1024
        cpu_bytes = (1 << 30) if args.device == "cuda" else (256 << 20)
        check_shm(2 * cpu_bytes + (64 << 20))
        results = {}
        for tier in ("peerkv", "p2p"):
            # One pair at a time: vLLM's tier keeps its engines stepping even when idle.
            pair = make_pair(tier, args.device, model, max_len, cpu_bytes)
            try:
                t = time.monotonic()
                start_pair(pair, args.device, deadline)
                print(f"gpu-check: {tier} engines ready in {time.monotonic() - t:.0f}s", flush=True)
                results[tier] = measure_tier(tier, pair, sizes, args.repeat, deadline)
            finally:
                engines.stop_all(pair)
        print_table(found, results, sizes, args.repeat)
        print(f"gpu-check: ok in {time.monotonic() - deadline.start:.0f}s (engine logs in {LOGS.relative_to(REPO)}/)")
        return 0
    except (CheckFailed, AssertionError, engines.EngineError, OSError) as e:
        # OSError: a request past its time (TimeoutError), a refused connection.
        what = f"{type(e).__name__}: {e} (engine logs in {LOGS.relative_to(REPO)}/)" if isinstance(e, OSError) else e
        print(f"gpu-check: FAILED: {what}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

"""Cost on vLLM's scheduler thread of PeerKVTier versus stock vLLM's p2p tier, in one run.

This process is the consumer engine: after the per-process setup of an interop
node (interop_node.prepare_engine_process: _child_env's PYTHONHASHSEED and UCX
settings, init_none_hash) it builds two real TieringOffloadingManagers with
peerkv_node._build_manager, one with the stock "p2p" tier, one with
PeerKVTier. A spawned producer (an InteropNode, as in p2p_latency.py) hosts one
manager of each kind, each storing the same KEYS rows. Every consumer request
has kv_transfer_params {"remote_kv_source": {"kv_request_id": <unique>,
"remote_host": "127.0.0.1", "remote_port": <producer port>}}, is started with
manager.on_new_request and finished with manager.on_request_finished, both
untimed. The lookup deadlines are each release's own (the tests' short ones
would cut a round short on a loaded machine): this process keeps vLLM's p2p
deadlines, and PeerKVTier's lookup_timeout_s and inbound_lookup_timeout_s are
left at the library defaults.

The tiers are driven the way TieringOffloadingManager drives a secondary tier,
calling manager.secondary_tiers[0] directly with the manager's lock held (on
0.32, which has no lock, the stand-in's lock from vllm_compat). A step is
get_finished_jobs (the once-per-step poll), lookup(key, ctx) for every key of
every request, serve_external_requests(parent) and on_schedule_end. No job is
ever submitted (lookups only, no promotion), so get_finished_jobs must return
nothing; the bench fails if it does. vLLM 0.33's tier-poll thread runs in both
processes, as in an engine. While a section is timed, both consumer managers'
locks are held, so no poll round runs in this process, and gc is disabled.
Times include the Python loop around the calls, the same for both tiers. Each
figure is printed twice: wall time (time.perf_counter_ns), then the CPU time
the scheduler thread itself spent (time.thread_time_ns). On a machine with
few cores the two differ: the wall time also counts the scheduler thread
waiting for a core while the library's threads (sending the step's lookups,
in the background where vLLM's tier sends on the scheduler thread) or the
producer process run.

Figures, each the median of REPS repetitions (min..max beside it), REQUESTS x
KEYS = 16384 lookups a pass, the tiers taking turns to go first:

 1. lookup, first ask: one step's pass over keys never asked (each registers
    and answers RETRY), time / 16384. Also printed: that whole step, whose
    on_schedule_end sends the REQUESTS lookups.
 2. lookup while waiting: the next step's pass over the same keys, after the
    lookups went out. The answers are held back deterministically: the
    producer's manager for that tier holds its lock (peerkv_node's hold
    command: its scheduler in one long step, its tier-poll thread blocked)
    from before the first ask until this pass has ended, so it cannot answer;
    every key must still be RETRY.
 3. lookup, answered: once the producer is released and steps have seen
    every key HIT, one more step's pass (all HIT), time / 16384.
 4. step, answers arrived: fresh requests; one untimed step asks every key
    and sends the lookups; then this process keeps both consumer locks (so no
    tier-poll round takes the answers in) and sleeps twice as long as figure
    3's rounds took from release to all-HIT (the slower tier's median; the
    same wait for both); then one whole timed step: get_finished_jobs (where
    a tier may apply the answers that arrived) + 16384 lookups +
    serve_external_requests + on_schedule_end. No lookup or poll touches
    these requests between the ask and the timed step. If that step does not
    see every key HIT, answers were late: the repetition is discarded and
    redone with twice the wait (at most MAX_WAIT_S).
 5. idle host calls, no request in flight: IDLE_CALLS calls of each of
    on_schedule_end, serve_external_requests, get_finished_jobs and
    has_pending_work, time / IDLE_CALLS.

Every key of every request must end HIT for both tiers, else the bench exits
non-zero saying which tier and figure. Ratios are peerkv / vLLM (lower is
better); these machines are noisy, so compare ratios within one run.

Run from the repository root: .venv/bin/python tests/bench/scheduler_calls.py
"""

from __future__ import annotations

import contextlib
import gc
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

REPO = Path(__file__).resolve().parents[2]
for sub in ("python", "tests/python", "tests/interop"):
    sys.path.insert(0, str(REPO / sub))
os.environ.setdefault("PEERKV_LIBRARY", str(REPO / "build" / "libpeerkv.so"))

from interop_node import HASH_SEED, InteropNode, _child_env, prepare_engine_process, vllm_p2p_config  # noqa: E402
from peerkv_node import (  # noqa: E402
    _build_manager,
    control_port,
    kv_transfer_config,
    new_kv_id,
    random_keys,
    random_rows,
    region_prefix,
)
from vllm_compat import VLLM_VERSION, manager_lock  # noqa: E402

REQUESTS = 256
KEYS = 64
REPS = 5
IDLE_CALLS = 10000
HOST = "127.0.0.1"
KINDS = ("vllm", "peerkv")
STEP_GAP_S = 0.001  # between untimed steps: the tier-poll interval
ANSWER_TIMEOUT_S = 20.0  # every key HIT within this, or the bench fails
SETTLE_S = 0.1  # stepping after requests finish, before the next round
MIN_WAIT_S, MAX_WAIT_S = 0.2, 4.0  # figure 4's locked wait for the answers


def config(kind: str, port: int) -> dict:
    if kind == "vllm":
        return vllm_p2p_config(port)
    cfg = kv_transfer_config(port)  # what interop_node.peerkv_config gives, less two deadlines
    tier = cfg["kv_connector_extra_config"]["secondary_tiers"][0]
    for key in ("lookup_timeout_s", "inbound_lookup_timeout_s"):
        tier.pop(key, None)
    return cfg


class Elapsed(NamedTuple):
    """Wall and this thread's CPU time (what the scheduler thread paid), in
    ns from Clock; .per and .us scale both."""

    wall: float
    cpu: float

    def per(self, n: int) -> "Elapsed":
        return Elapsed(self.wall / n, self.cpu / n)

    def us(self) -> "Elapsed":
        return Elapsed(self.wall / 1e3, self.cpu / 1e3)


class Clock:
    """Wall and thread CPU time from its creation. On a machine with few
    cores the library's threads (sending the step's lookups) and the
    producer's take cores from the scheduler thread, which wall time counts
    and its CPU time does not; a server's cores are rarely that scarce."""

    def __init__(self) -> None:
        self.wall, self.cpu = time.perf_counter_ns(), time.thread_time_ns()

    def elapsed(self) -> Elapsed:
        return Elapsed(time.perf_counter_ns() - self.wall, time.thread_time_ns() - self.cpu)


def fail(message: str) -> None:
    raise SystemExit(f"scheduler_calls: FAILED: {message}")


class Consumer:
    """One consumer manager and its secondary tier, driven as vLLM's scheduler does."""

    def __init__(self, kind: str, manager, producer_port: int, keys: list[bytes]) -> None:
        from vllm.v1.kv_offload.base import LookupResult, ScheduleEndContext

        self.kind, self.manager, self.producer_port, self.keys = kind, manager, producer_port, keys
        self.tier = manager.secondary_tiers[0]
        # The ParentManager handle the manager passes this tier in serve_external_requests.
        self.parent = manager._tier_parents[self.tier]
        self.lock = manager_lock(manager)
        self.end = ScheduleEndContext(new_req_ids=[], preempted_req_ids=[])
        self.HIT, self.RETRY = LookupResult.HIT, LookupResult.RETRY

    def start(self) -> list:
        from vllm.v1.kv_offload.base import ReqContext

        ctxs = []
        for _ in range(REQUESTS):
            kid = new_kv_id()
            source = {"kv_request_id": kid, "remote_host": HOST, "remote_port": self.producer_port}
            ctxs.append(ReqContext(req_id=f"{self.kind}-{kid}", kv_transfer_params={"remote_kv_source": source}))
        with self.lock:
            for ctx in ctxs:
                self.manager.on_new_request(ctx)
        return ctxs

    def finish(self, ctxs: list) -> None:
        with self.lock:
            for ctx in ctxs:
                self.manager.on_request_finished(ctx)
        self.settle()

    def settle(self) -> None:
        """Untimed steps for SETTLE_S: the finishes go out, the producer takes them in."""
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            with self.lock:
                self.poll()
                self.end_step()
            time.sleep(STEP_GAP_S)

    def poll(self) -> None:
        """get_finished_jobs, iterated as the manager does; no job was submitted."""
        for job in self.tier.get_finished_jobs():
            fail(f"{self.kind}: get_finished_jobs reported job {job.job_id}, but none was submitted")

    def end_step(self) -> None:
        self.tier.serve_external_requests(self.parent)
        self.tier.on_schedule_end(self.end)

    def lookup_pass(self, ctxs: list, want) -> tuple[Elapsed, int]:
        """One step's lookups: every key of every request. Returns (time, results other than want)."""
        lookup, keys, off = self.tier.lookup, self.keys, 0
        t0 = Clock()
        for ctx in ctxs:
            for key in keys:
                if lookup(key, ctx) is not want:
                    off += 1
        return t0.elapsed(), off

    def check(self, off: int, what: str, want) -> None:
        if off:
            fail(f"{self.kind} ({what}): {off} of {REQUESTS * KEYS} lookups did not answer {want.name}")

    def wait_all_hit(self, ctxs: list, what: str) -> float:
        """Untimed steps until every key of ctxs is HIT; returns the seconds it took."""
        pending = [(ctx, key) for ctx in ctxs for key in self.keys]
        start = time.monotonic()
        while pending:
            if time.monotonic() - start > ANSWER_TIMEOUT_S:
                fail(f"{self.kind} ({what}): {len(pending)} of {len(ctxs) * KEYS} keys not HIT "
                     f"after {ANSWER_TIMEOUT_S:.0f} s")
            still = []
            with self.lock:
                self.poll()
                for ctx, key in pending:
                    result = self.tier.lookup(key, ctx)
                    if result is self.RETRY:
                        still.append((ctx, key))
                    elif result is not self.HIT:
                        fail(f"{self.kind} ({what}): a key answered {result.name}, not HIT")
                self.end_step()
            pending = still
            time.sleep(STEP_GAP_S)
        return time.monotonic() - start


@contextlib.contextmanager
def quiet(consumers: dict[str, Consumer]):
    """Every consumer manager's lock held (no tier-poll round runs here), gc off."""
    with contextlib.ExitStack() as stack:
        for kind in KINDS:
            stack.enter_context(consumers[kind].lock)
        gc.disable()
        try:
            yield
        finally:
            gc.enable()


def ask_round(c: Consumer, consumers: dict[str, Consumer], producer: InteropNode) -> dict[str, float]:
    """Figures 1-3 for one tier: first ask, waiting (producer held), answered."""
    n = REQUESTS * KEYS
    ctxs = c.start()
    producer.call("hold", f"{c.kind}_prod", True)
    try:
        with quiet(consumers):
            t0 = Clock()
            c.poll()
            first, off_first = c.lookup_pass(ctxs, c.RETRY)
            c.end_step()  # sends the lookups
            step = t0.elapsed()
        time.sleep(STEP_GAP_S)  # a poll round may run here; nothing can be answered
        with quiet(consumers):
            c.poll()
            wait, off_wait = c.lookup_pass(ctxs, c.RETRY)
            c.end_step()
    finally:
        producer.call("hold", f"{c.kind}_prod", False)
    c.check(off_first, "first ask", c.RETRY)
    c.check(off_wait, "while waiting, producer held", c.RETRY)
    released = time.monotonic()
    c.wait_all_hit(ctxs, "answers after the producer was released")
    answer_s = time.monotonic() - released
    with quiet(consumers):
        c.poll()
        hit, off = c.lookup_pass(ctxs, c.HIT)
        c.end_step()
    c.check(off, "answered", c.HIT)
    c.finish(ctxs)
    return {"first": first.per(n).us(), "wait": wait.per(n).us(), "hit": hit.per(n).us(),
            "step_first": step.us(), "answer_s": answer_s}


def answered_step(c: Consumer, consumers: dict[str, Consumer], wait_s: float) -> Elapsed | None:
    """Figure 4 for one tier: µs of one whole step once every answer has arrived,
    or None if some key was not HIT yet (answers late: the caller waits longer)."""
    ctxs = c.start()
    off, step = 0, Elapsed(0, 0)
    with quiet(consumers):  # held from the ask to the timed step: nothing takes answers in between
        c.poll()
        _, off_ask = c.lookup_pass(ctxs, c.RETRY)
        c.end_step()  # sends the lookups
        if not off_ask:
            time.sleep(wait_s)
            t0 = Clock()
            c.poll()
            _, off = c.lookup_pass(ctxs, c.HIT)
            c.end_step()
            step = t0.elapsed()
    c.check(off_ask, "first ask before the answered step", c.RETRY)
    if off:
        c.wait_all_hit(ctxs, "late answers")  # every key must still end HIT
    c.finish(ctxs)
    return None if off else step.us()


def idle_calls(c: Consumer, consumers: dict[str, Consumer]) -> dict[str, Elapsed]:
    """Figure 5 for one tier: µs per call with no request in flight."""
    tier, out = c.tier, {}
    calls = [("on_schedule_end", tier.on_schedule_end, (c.end,)),
             ("serve_external_requests", tier.serve_external_requests, (c.parent,)),
             ("get_finished_jobs", tier.get_finished_jobs, ()),
             ("has_pending_work", tier.has_pending_work, ())]
    with quiet(consumers):
        for name, fn, args in calls:
            jobs = 0
            t0 = Clock()
            if name == "get_finished_jobs":
                for _ in range(IDLE_CALLS):
                    for _job in fn():
                        jobs += 1
            else:
                for _ in range(IDLE_CALLS):
                    fn(*args)
            out[name] = t0.elapsed().per(IDLE_CALLS).us()
            if jobs:
                fail(f"{c.kind}: idle get_finished_jobs reported {jobs} jobs")
    return out


def fmt(us: float) -> str:
    return f"{us:.0f}" if us >= 100 else f"{us:.2f}" if us >= 1 else f"{us:.3f}"


def report(what: str, samples: dict[str, list[Elapsed]]) -> None:
    """Wall time as the figure, then the scheduler thread's CPU time."""
    line = []
    for field in Elapsed._fields:
        got = {k: [getattr(e, field) for e in samples[k]] for k in KINDS}
        v, p = (statistics.median(got[k]) for k in KINDS)
        ranges = ", ".join(f"{k} {fmt(min(got[k]))}..{fmt(max(got[k]))}" for k in KINDS)
        label = "" if field == "wall" else "; scheduler-thread CPU: "
        line.append(f"{label}vllm {fmt(v)} µs, peerkv {fmt(p)} µs, ratio {p / v:.2f} "
                    f"(min..max over {len(got['vllm'])} reps: {ranges})")
    print(f"scheduler_calls: {what}: {''.join(line)}", flush=True)


def turns(rep: int) -> tuple[str, ...]:
    return KINDS if rep % 2 == 0 else KINDS[::-1]


def main() -> None:
    producer = InteropNode()  # imports vLLM while this process does
    prepare_engine_process(_child_env(HASH_SEED), short_deadlines=False)  # this process: the consumer engine
    consumers: dict[str, Consumer] = {}
    try:
        producer.ready()
        keys, rows = random_keys(KEYS), random_rows(KEYS)
        for kind in KINDS:
            port = control_port()
            producer.call("add", f"{kind}_prod", config(kind, port), timeout=60)
            stored = producer.call("store", f"{kind}_prod", f"src-{kind}", None, keys, rows)
            if stored != KEYS:
                fail(f"{kind} producer stored {stored} of {KEYS} rows")
            consumers[kind] = Consumer(kind, _build_manager(config(kind, control_port())), port, keys)
        gc.collect()
        gc.freeze()  # vLLM's and torch's objects: no later collection walks them
        print(f"scheduler_calls: vLLM {VLLM_VERSION}, {REQUESTS} requests x {KEYS} keys "
              f"({REQUESTS * KEYS} lookups a pass), {REPS} reps; tiers called directly "
              f"under the manager lock", flush=True)

        for kind in KINDS:  # warm-up, discarded: the handshake (nothing held), then one round
            c = consumers[kind]
            ctxs = c.start()
            c.wait_all_hit(ctxs, "first requests, handshake included")
            c.finish(ctxs)
            ask_round(c, consumers, producer)

        asks: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
        for rep in range(REPS):
            for kind in turns(rep):
                asks[kind].append(ask_round(consumers[kind], consumers, producer))
        for key, what in [("first", "lookup, first ask (RETRY), per key"),
                          ("wait", "lookup while waiting (RETRY, producer held), per key"),
                          ("hit", "lookup, answered (HIT), per key")]:
            report(what, {k: [r[key] for r in asks[k]] for k in KINDS})
        report(f"step, first ask (get_finished_jobs + {REQUESTS * KEYS} lookups + serve_external_requests "
               f"+ on_schedule_end sending {REQUESTS} lookups)",
               {k: [r["step_first"] for r in asks[k]] for k in KINDS})

        answer_s = max(statistics.median(r["answer_s"] for r in asks[k]) for k in KINDS)  # seconds
        wait_s = min(MAX_WAIT_S, max(MIN_WAIT_S, 2 * answer_s))
        steps: dict[str, list[Elapsed]] = {k: [] for k in KINDS}
        for rep in range(REPS):
            for kind in turns(rep):
                us = answered_step(consumers[kind], consumers, wait_s)
                while us is None:
                    if wait_s >= MAX_WAIT_S:
                        fail(f"{kind}: the answers had not all arrived {wait_s:.1f} s after the lookups went out")
                    wait_s = min(MAX_WAIT_S, 2 * wait_s)
                    print(f"scheduler_calls: {kind}: answers late; measuring the step again after "
                          f"{wait_s * 1e3:.0f} ms", flush=True)
                    us = answered_step(consumers[kind], consumers, wait_s)
                steps[kind].append(us)
        report(f"step, answers arrived (get_finished_jobs + {REQUESTS * KEYS} lookups, all HIT, + "
               f"serve_external_requests + on_schedule_end; waits for the answers up to {wait_s * 1e3:.0f} ms)",
               steps)

        for c in consumers.values():
            c.settle()
        idle: dict[str, list[dict[str, Elapsed]]] = {k: [] for k in KINDS}
        for rep in range(REPS):
            for kind in turns(rep):
                idle[kind].append(idle_calls(consumers[kind], consumers))
        for name in ("on_schedule_end", "serve_external_requests", "get_finished_jobs", "has_pending_work"):
            report(f"idle {name}, per call ({IDLE_CALLS} calls)", {k: [r[name] for r in idle[k]] for k in KINDS})
        print("scheduler_calls: every key of every request ended HIT for both tiers", flush=True)
    finally:
        for c in consumers.values():
            try:
                c.manager.shutdown()
            except Exception as exc:  # still close the producer
                print(f"scheduler_calls: {c.kind} consumer shutdown: {exc}", file=sys.stderr)
        for path in Path("/dev/shm").glob(f"vllm_offload_{region_prefix(os.getpid())}*"):
            path.unlink(missing_ok=True)
        producer.close()


if __name__ == "__main__":
    main()

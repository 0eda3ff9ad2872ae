"""Gets a peer's request served promptly: wakes an idle vLLM engine (0.32)
or runs vLLM's tier-poll round early (0.33) when the library signals.

vLLM 0.32 services secondary tiers only from engine steps, and an idle
EngineCore sleeps on its input queue until a client request arrives. A
producer with nothing of its own to compute would then never answer a remote
consumer's lookup (vLLM's own p2p tier avoids that by always reporting work,
which keeps a core busy forever). 0.33 added a tier-poll thread that makes
this unnecessary there.

EngineWaker waits on the library's notify fd on its own thread (no GIL held,
no CPU while nothing happens). When the library queues something for the host
— an inbound lookup, a finished job, answers to its lookups — it marks work
pending and puts vLLM's own WAKEUP request on the engine's input queue, so
the engine runs one step, in which the tier collects and answers on the
scheduler thread as usual.

EarlyPoller is the same thread on 0.33: on a signal it runs the round vLLM's
tier-poll thread runs every tier_poll_interval_s, at once.
"""

from __future__ import annotations

import logging
import os
import queue
import select
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

logger = logging.getLogger("vllm.peerkv")

# Upper bound of one wait, so a lost stop request still ends the thread.
_WAIT_MS = 1000
# EarlyPoller: how long one try for the manager lock lasts before the stop
# flag is checked again; the least time between two of its rounds; the
# least time between two logged failures.
_LOCK_WAIT_S = 0.1
_MIN_ROUND_GAP_S = 0.001  # vLLM's own thread pauses as long between rounds
_ERROR_LOG_INTERVAL_S = 10.0
# Rounds that fail for this long, this many in a row, stop the poller (as
# vLLM's thread stops after 30 s of failed rounds; ours run only on signals).
_GIVE_UP_AFTER_S = 30.0
_GIVE_UP_AFTER_FAILURES = 100
# How far up the stack the tier's constructor may be from EngineCoreProc's.
_MAX_FRAMES = 64


def find_engine_wakeup(start: FrameType | None = None) -> Callable[[], None] | None:
    """A function that wakes the EngineCore whose construction is on the stack.

    The tier is built inside EngineCoreProc.__init__ (scheduler → connector →
    offloading manager → tier), after the engine's input queue exists. Returns
    None when there is no such engine (in-process LLM, other frontends), in
    which case the engine steps only while the host reports pending work.
    """
    try:
        from vllm.v1.engine import EngineCoreRequestType
    except ImportError:
        return None
    wakeup_request = (EngineCoreRequestType.WAKEUP, None)
    frame = start if start is not None else sys._getframe(1)
    for _ in range(_MAX_FRAMES):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        if owner is not None and any(c.__name__ == "EngineCoreProc" for c in type(owner).__mro__):
            inputs = getattr(owner, "input_queue", None)
            if isinstance(inputs, queue.Queue):
                return _waker_for(inputs, wakeup_request)
        frame = frame.f_back
    return None


def _waker_for(inputs: queue.Queue, request: tuple[Any, None]) -> Callable[[], None]:
    def wake() -> None:
        # A queued client request wakes the engine anyway.
        if inputs.empty():
            inputs.put_nowait(request)

    return wake


class _NotifyThread:
    """A thread that waits on the library's notify fd (no GIL held, no CPU
    while nothing happens) and runs _signalled() after each signal."""

    def __init__(self, notify_fd: int, name: str) -> None:
        self._fd = notify_fd
        self._stopping = threading.Event()
        self._stop_r, self._stop_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self._stop_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _signalled(self) -> None:
        raise NotImplementedError

    def stop(self, timeout: float = 5.0) -> None:
        """Ends the thread and closes its pipe. Idempotent: a second call
        must not close descriptor numbers the process may have reused."""
        with self._stop_lock:
            if self._stop_r < 0:
                return
            self._stopping.set()
            try:
                os.write(self._stop_w, b"x")
            except OSError:
                pass
            self._thread.join(timeout)
            if self._thread.is_alive():
                logger.warning("peerkv thread %s did not stop within %.0fs", self._thread.name, timeout)
                return  # it still polls the pipe: leave it open
            os.close(self._stop_r)
            os.close(self._stop_w)
            self._stop_r = self._stop_w = -1

    def _exited(self) -> None:
        """Runs on the thread as it ends, whatever ended it."""

    def _run(self) -> None:
        try:
            self._wait_for_signals()
        finally:
            self._exited()

    def _wait_for_signals(self) -> None:
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        while not self._stopping.is_set():
            try:
                events = poller.poll(_WAIT_MS)
            except InterruptedError:
                continue
            ready = {fd for fd, _ in events}
            if self._stop_r in ready:
                return
            if self._fd not in ready:
                continue
            try:
                os.read(self._fd, 8)
            except BlockingIOError:
                continue
            except OSError as exc:
                logger.error("peerkv thread %s stops: reading the notify fd: %s", self._thread.name, exc)
                return
            try:
                self._signalled()
            except Exception:  # never let the thread die silently
                logger.exception("peerkv thread %s: handling a library signal failed", self._thread.name)


class EngineWaker(_NotifyThread):
    """One thread per tier: notify fd readable → pending = True → wake()."""

    def __init__(self, notify_fd: int, wake: Callable[[], None], name: str) -> None:
        self._wake = wake
        self._pending = threading.Event()
        super().__init__(notify_fd, name)

    @property
    def pending(self) -> bool:
        """True from a library signal until the scheduler next collects."""
        return self._pending.is_set()

    def collecting(self) -> None:
        """Called by the scheduler thread before it collects; a signal that
        arrives afterwards sets pending again."""
        self._pending.clear()

    def keep_pending(self) -> None:
        """The scheduler left work queued (a per-call cap): the engine must
        step again although the library sends no new signal."""
        self._pending.set()

    def _signalled(self) -> None:
        self._pending.set()
        self._wake()


class EarlyPoller(_NotifyThread):
    """On a vLLM with a tier-poll thread (0.33), runs the tier's poll round
    as soon as the library signals, instead of when vLLM's thread next wakes
    (every tier_poll_interval_s, 1 ms by default): a producer answers a
    peer's lookup, and a finished job is accounted, without waiting out the
    interval. The round is vLLM's (poll_tiers()) narrowed to this tier, run
    under the manager's lock, which covers the whole round as vLLM requires.
    """

    def __init__(
        self,
        notify_fd: int,
        lock: Any,
        poll: Callable[[], None],
        name: str,
        on_exit: Callable[[], None] | None = None,
    ) -> None:
        self._lock = lock
        self._poll = poll
        self._on_exit = on_exit
        self._failing_since: float | None = None
        self._failures = 0  # in a row
        self._failure_logged_at = 0.0
        super().__init__(notify_fd, name)

    def _signalled(self) -> None:
        while not self._stopping.is_set():
            # Bounded, so a stop request is seen while the scheduler (or a
            # shutdown) holds the lock.
            if not self._lock.acquire(timeout=_LOCK_WAIT_S):
                continue
            try:
                if self._stopping.is_set():
                    return
                self._poll()
                self._failing_since, self._failures = None, 0
            except Exception:
                self._failed()
            finally:
                self._lock.release()
            break
        # Python locks are not fair: pause before the next round so a
        # scheduler thread waiting for the lock gets it (as vLLM's thread does).
        self._stopping.wait(_MIN_ROUND_GAP_S)

    def _exited(self) -> None:
        if self._on_exit is not None:
            self._on_exit()

    def _failed(self) -> None:
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        self._failures += 1
        if now - self._failing_since >= _GIVE_UP_AFTER_S and self._failures >= _GIVE_UP_AFTER_FAILURES:
            logger.error(
                "peerkv: early tier-poll rounds failed for %.0f s; stopping them (vLLM's own rounds go on)",
                _GIVE_UP_AFTER_S,
            )
            self._stopping.set()  # the thread ends at its next wait
            return
        if now - self._failure_logged_at >= _ERROR_LOG_INTERVAL_S:
            self._failure_logged_at = now
            logger.exception("peerkv: an early tier-poll round failed; vLLM's own rounds go on")

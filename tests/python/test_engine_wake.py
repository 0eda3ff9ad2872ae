"""The engine waker: finds the EngineCore under construction on the stack and
wakes it through vLLM's own WAKEUP request when the library signals."""

from __future__ import annotations

import os
import queue
import time

import pytest

from peerkv._engine_wake import EngineWaker, find_engine_wakeup
from vllm.v1.engine import EngineCoreRequestType

WAKEUP = EngineCoreRequestType.WAKEUP


class EngineCore:
    def __init__(self, build):
        self.built = build()


class EngineCoreProc(EngineCore):
    """Stands for vLLM's: the queue exists before the scheduler (and so the
    tier) is built in the base constructor."""

    def __init__(self, build):
        self.input_queue = queue.Queue()
        super().__init__(build)


class DPEngineCoreProc(EngineCoreProc):
    pass


def _tier_constructor():
    def nested():  # the tier sits a few frames below the engine
        return find_engine_wakeup()

    return nested()


def _wait(predicate, timeout=5.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return False


@pytest.mark.parametrize("engine_cls", [EngineCoreProc, DPEngineCoreProc])
def test_finds_the_engine_being_built_and_wakes_it(engine_cls):
    engine = engine_cls(_tier_constructor)
    wake = engine.built
    assert wake is not None
    wake()
    wake()  # a queued request already wakes it: no second one
    assert engine.input_queue.get_nowait() == (WAKEUP, None)
    assert engine.input_queue.empty()


def test_no_engine_on_the_stack():
    assert _tier_constructor() is None
    assert EngineCore(_tier_constructor).built is None


def test_signal_sets_pending_and_wakes_until_collected():
    fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    woken = []
    waker = EngineWaker(fd, lambda: woken.append(1), name="test-wake")
    try:
        time.sleep(0.05)
        assert not waker.pending and not woken, "woke without a signal"
        os.eventfd_write(fd, 1)
        assert _wait(lambda: waker.pending and woken)
        waker.collecting()
        assert not waker.pending
        os.eventfd_write(fd, 1)
        assert _wait(lambda: waker.pending and len(woken) == 2)
    finally:
        started = time.monotonic()
        waker.stop()
        assert time.monotonic() - started < 2, "stop did not wake the thread"
        os.close(fd)


def test_work_left_at_a_cap_stays_pending_without_a_signal():
    fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    waker = EngineWaker(fd, lambda: None, name="test-wake")
    try:
        waker.collecting()
        waker.keep_pending()
        assert waker.pending
        waker.collecting()
        assert not waker.pending
    finally:
        waker.stop()
        os.close(fd)


def test_a_failing_wake_does_not_kill_the_thread():
    fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    calls = []

    def wake():
        calls.append(1)
        raise RuntimeError("queue gone")

    waker = EngineWaker(fd, wake, name="test-wake")
    try:
        os.eventfd_write(fd, 1)
        assert _wait(lambda: len(calls) == 1)
        os.eventfd_write(fd, 1)
        assert _wait(lambda: len(calls) == 2)
    finally:
        waker.stop()
        os.close(fd)

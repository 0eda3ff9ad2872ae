"""The engine waker: finds the EngineCore under construction on the stack and
wakes it through vLLM's own WAKEUP request when the library signals. The
early poller: runs the manager's poll round, under its lock, when the library
signals."""

from __future__ import annotations

import os
import queue
import threading
import time

import pytest

from peerkv._engine_wake import EarlyPoller, EngineWaker, find_engine_wakeup
from peerkv_node import wait_until
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
        assert wait_until(lambda: waker.pending and woken)
        waker.collecting()
        assert not waker.pending
        os.eventfd_write(fd, 1)
        assert wait_until(lambda: waker.pending and len(woken) == 2)
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
        assert wait_until(lambda: len(calls) == 1)
        os.eventfd_write(fd, 1)
        assert wait_until(lambda: len(calls) == 2)
    finally:
        waker.stop()
        os.close(fd)


class _Manager:
    """What EarlyPoller uses of vLLM's TieringOffloadingManager: lock and
    poll_tiers(), which vLLM requires be called with the lock held."""

    def __init__(self, fail: bool = False) -> None:
        self.lock = threading.Lock()
        self.rounds = 0
        self.unlocked_rounds = 0
        self.fail = fail

    def poll_tiers(self) -> None:
        if not self.lock.locked():
            self.unlocked_rounds += 1
        self.rounds += 1
        if self.fail:
            raise RuntimeError("a tier failed")


def test_a_signal_runs_one_poll_round_under_the_manager_lock():
    fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    manager = _Manager()
    poller = EarlyPoller(fd, manager.lock, manager.poll_tiers, name="test-poll")
    try:
        time.sleep(0.05)
        assert manager.rounds == 0, "polled without a signal"
        os.eventfd_write(fd, 1)
        assert wait_until(lambda: manager.rounds == 1)
        time.sleep(0.05)
        assert manager.rounds == 1, "one signal, more than one round"
        assert manager.unlocked_rounds == 0
    finally:
        poller.stop()
        os.close(fd)


def test_a_round_waits_for_the_lock_and_stop_does_not_wait_for_it():
    fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    manager = _Manager()
    poller = EarlyPoller(fd, manager.lock, manager.poll_tiers, name="test-poll")
    with manager.lock:  # the scheduler's step, or a shutdown holding the lock
        os.eventfd_write(fd, 1)
        time.sleep(0.1)
        assert manager.rounds == 0, "polled while another thread held the lock"
        started = time.monotonic()
        poller.stop()
        assert time.monotonic() - started < 2, "stop waited for the manager lock"
    time.sleep(0.05)
    assert manager.rounds == 0, "polled after stop"
    os.close(fd)


def test_a_failing_round_does_not_kill_the_poller(caplog):
    fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    manager = _Manager(fail=True)
    poller = EarlyPoller(fd, manager.lock, manager.poll_tiers, name="test-poll")
    try:
        with caplog.at_level("ERROR", logger="vllm.peerkv"):
            os.eventfd_write(fd, 1)
            assert wait_until(lambda: manager.rounds == 1)
            os.eventfd_write(fd, 1)
            assert wait_until(lambda: manager.rounds == 2)
        assert not manager.lock.locked(), "a failed round kept the lock"
        assert "early tier-poll round failed" in caplog.text
    finally:
        poller.stop()
        os.close(fd)


def test_a_poller_whose_rounds_keep_failing_gives_up_and_says_so(monkeypatch, caplog):
    """After _GIVE_UP_AFTER_S of failing rounds (and that many in a row) the
    poller stops, and its on_exit callback runs, so the tier can go back to
    asking for engine steps."""
    import peerkv._engine_wake as engine_wake

    monkeypatch.setattr(engine_wake, "_GIVE_UP_AFTER_S", 0.0)
    monkeypatch.setattr(engine_wake, "_GIVE_UP_AFTER_FAILURES", 3)
    fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    manager = _Manager(fail=True)
    ended = threading.Event()
    poller = EarlyPoller(fd, manager.lock, manager.poll_tiers, name="test-poll", on_exit=ended.set)
    try:
        with caplog.at_level("ERROR", logger="vllm.peerkv"):
            for rounds in (1, 2):
                os.eventfd_write(fd, 1)
                assert wait_until(lambda: manager.rounds == rounds)
            assert not ended.is_set(), "gave up before _GIVE_UP_AFTER_FAILURES rounds"
            os.eventfd_write(fd, 1)
            assert ended.wait(5), "the poller did not end after failing rounds"
        assert "stopping them" in caplog.text
        os.eventfd_write(fd, 1)
        time.sleep(0.05)
        assert manager.rounds == 3, "a round ran after the poller gave up"
    finally:
        poller.stop()
        os.close(fd)


def test_stop_runs_on_exit_once_and_may_be_called_again():
    fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    manager = _Manager()
    calls = []
    poller = EarlyPoller(fd, manager.lock, manager.poll_tiers, name="test-poll", on_exit=lambda: calls.append(1))
    poller.stop()
    poller.stop()  # idempotent: closes nothing twice
    os.close(fd)
    assert calls == [1]

"""A forked child of a process that loaded the library fails fast and cleanly."""

import os
import time

import peerkv
from peerkv_node import control_port

_CHILD_DEADLINE_S = 10.0


def _wait_child(pid: int) -> int:
    deadline = time.monotonic() + _CHILD_DEADLINE_S
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    raise AssertionError("forked child hung")


def test_call_in_forked_child_raises_fork_error(library):
    region = bytearray(4 * 4096)
    node = peerkv.Node(region, 4, 4096, {"host": "127.0.0.1", "port": control_port(), "data_port": 0, "key_len": 36})
    try:
        pid = os.fork()
        if pid == 0:  # child: must not touch the Go runtime
            code = 1
            try:
                started = time.monotonic()
                try:
                    node.has_pending_work()
                except peerkv.PeerKVForkError as exc:
                    fast = time.monotonic() - started < 1.0
                    code = 0 if fast and "forked child" in str(exc) and peerkv.in_forked_child() else 2
                # The inherited Node's finalizer must skip silently.
                del node
            finally:
                os._exit(code)
        assert _wait_child(pid) == 0
        assert not peerkv.in_forked_child()
        assert node.has_pending_work() in (True, False)  # parent still works
    finally:
        node.destroy()

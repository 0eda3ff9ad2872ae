"""The same-host copy under a host that installs its own fault handlers after
the library loaded, as vLLM's EngineCore does with faulthandler.enable(): a
consumer that shrinks its region file under a pull fails that pull, and the
producer (Go's SIGBUS handler replaced by Python's) keeps serving."""

import os
import signal
import subprocess
import sys

from peerkv_node import control_port

ROWS, ROW_LEN = 16, 64 << 10

# `peerkv serve`, with faulthandler enabled once the library is loaded and
# its runtime started (the Node exists), not before.
PRODUCER = """
import faulthandler, sys
import peerkv.node
made = peerkv.node.Node.__init__
def init(self, *args, **kwargs):
    made(self, *args, **kwargs)
    faulthandler.enable()
peerkv.node.Node.__init__ = init
from peerkv.__main__ import main
sys.exit(main(sys.argv[1:]))
"""

# A consumer that pulls once (the session and its same-host grant), shrinks
# its region file to nothing, pulls again and says how that ended. It never
# reads its region after the shrink (that would fault here).
CONSUMER = """
import os, sys
from peerkv import _standalone
from peerkv.bench_cli import Puller
from peerkv.node import Node
port, rows, row_len = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
region = _standalone.region(rows, row_len)
options = {"host": "127.0.0.1", "port": _standalone.free_port("127.0.0.1"), "data_port": 0, "key_len": _standalone.KEY_LEN}
with Node(region, rows, row_len, options) as node:
    puller = Puller(node, f"127.0.0.1:{port}", rows, row_len)
    puller.round(region, 30)
    print("paths", ",".join(n for n, e in (node.stats().get("paths") or {}).items() if (e or {}).get("loads")), flush=True)
    def memfd(fd):
        try:
            return os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:peerkv-synthetic")
        except OSError:  # the fd listdir itself held
            return False
    os.ftruncate(next(fd for fd in map(int, os.listdir("/proc/self/fd")) if memfd(fd)), 0)
    try:
        puller.round(region, 30)
        print("pulled", flush=True)
    except RuntimeError as exc:
        print("failed:", exc, flush=True)
"""


def _env():
    return {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}


def test_a_shrinking_consumer_fails_its_pull_not_a_producer_under_faulthandler(library):
    port = control_port()
    producer = subprocess.Popen(
        [sys.executable, "-c", PRODUCER, "serve", "--port", str(port), "--rows", str(ROWS),
         "--row-len", str(ROW_LEN), "--seconds", "120"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(),
    )
    try:
        banner = producer.stdout.readline()
        assert "data paths shm" in banner, banner
        consumer = subprocess.run(
            [sys.executable, "-c", CONSUMER, str(port), str(ROWS), str(ROW_LEN)],
            capture_output=True, text=True, timeout=120, env=_env(),
        )
        assert consumer.returncode == 0, consumer.stderr
        said = consumer.stdout.splitlines()
        assert said[0] == "paths shm", said
        assert said[1].startswith("failed: the load failed"), said
        assert producer.poll() is None, "the producer died: " + producer.stdout.read()
        producer.send_signal(signal.SIGTERM)
        rest, _ = producer.communicate(timeout=60)
        assert producer.returncode == 0, rest
        assert "shrank" in rest, rest  # its log names why the transfer failed
    finally:
        if producer.poll() is None:
            producer.kill()
        producer.wait(timeout=30)

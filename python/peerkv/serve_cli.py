"""Run a standalone node that serves synthetic rows, to test a network.

Binds HOST:PORT like an engine's tier, holds ROWS synthetic rows of ROW_LEN
bytes in a region of its own, and answers every peer's lookups and fetches
for them (`peerkv bench` pulls them and checks each byte). No vLLM and no
GPU are involved. Runs until interrupted (Ctrl-C) or for --seconds.
"""

from __future__ import annotations

import argparse
import os
import select
import signal
import sys
import time

from peerkv import _standalone

HELP = "serve synthetic rows from a standalone node (for `peerkv bench`)"
EPILOG = """examples:
  peerkv serve --host 10.0.0.7 --port 5710
  peerkv serve --host 0.0.0.0 --advertise-host 10.0.0.7 --port 5710 --rows 512 --row-len 1048576
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--advertise-host", help="the address peers dial, when --host is a wildcard")
    parser.add_argument("--port", type=int, default=5710, help="control port (default 5710)")
    parser.add_argument("--data-port", type=int, help="TCP data port (default: port + 1000; 0: ephemeral)")
    parser.add_argument("--rows", type=int, default=_standalone.DEFAULT_ROWS, help="rows held (default 256)")
    parser.add_argument("--row-len", type=int, default=_standalone.DEFAULT_ROW_LEN, help="bytes per row (default 2 MiB)")
    parser.add_argument("--data-transport", help='"auto" (default), "tcp" or "nixl"')
    parser.add_argument("--auth-secret-file", help="the cluster's shared secret, in a file")
    parser.add_argument("--seconds", type=float, help="stop after this long (default: until interrupted)")


class Server:
    """The host side of a node that only serves: inbound lookups are HIT for
    the synthetic keys it holds (pinned as one job), finished pins dropped."""

    def __init__(self, node, rows: int) -> None:
        self.node = node
        self.held = {_standalone.key(i): i for i in range(rows)}
        self.next_job = 1
        self.served = 0

    def serve_once(self) -> None:
        while True:
            item = self.node.next_inbound()
            if item is None:
                break
            if item.kind != 1:  # FINISH: nothing of ours to release
                continue
            results, pins = [], []
            for key in item.keys:
                row = self.held.get(key)
                results.append(2 if row is not None else 1)  # LOOKUP_HIT / LOOKUP_MISS
                if row is not None:
                    pins.append(row)
            job = -1
            if pins:
                job, self.next_job = self.next_job, self.next_job + 1
            self.node.answer_inbound(item.lookup_id, results, job, pins)
        for result in self.node.get_finished():
            if result.success:
                self.served += 1


def run(args: argparse.Namespace) -> int:
    from peerkv.errors import PeerKVError
    from peerkv.node import Node

    if args.rows <= 0 or args.row_len <= 0:
        print("peerkv serve: --rows and --row-len must be positive", file=sys.stderr)
        return 2
    region = _standalone.region(args.rows, args.row_len)
    for i in range(args.rows):
        region[i * args.row_len : (i + 1) * args.row_len] = _standalone.row(i, args.row_len)
    options = {"host": args.host, "port": args.port, "key_len": _standalone.KEY_LEN,
               **_standalone.secret_options(args)}
    if args.advertise_host:
        options["advertise_host"] = args.advertise_host
    if args.data_port is not None:
        options["data_port"] = args.data_port
    try:
        node = Node(region, args.rows, args.row_len, options)
    except PeerKVError as exc:
        print(f"peerkv serve: {exc}", file=sys.stderr)
        return 1
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    server = Server(node, args.rows)
    fd = node.notify_fd()
    stats = node.stats()
    print(f"peerkv serve: {stats.get('local_id', args.port)}: {args.rows} rows x {args.row_len} bytes (block_len); "
          f"data paths {stats.get('data_paths', '?')}; Ctrl-C stops", flush=True)
    deadline = time.monotonic() + args.seconds if args.seconds else None
    try:
        while not stop and (deadline is None or time.monotonic() < deadline):
            ready, _, _ = select.select([fd], [], [], 0.5)
            if ready:
                try:
                    os.read(fd, 8)  # the counter; what it counted is collected below
                except BlockingIOError:
                    pass
            server.serve_once()
            for line in node.take_logs():
                print(f"peerkv serve: {line}", flush=True)
    except KeyboardInterrupt:
        pass
    finally:
        print(f"peerkv serve: stopping after serving {server.served} pulls", flush=True)
        node.shutdown()
        node.destroy()
    return 0

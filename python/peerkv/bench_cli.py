"""Pull synthetic rows from a `peerkv serve` peer and measure the network.

Each round is what an engine does for a P2P pull: a request naming the peer
as its remote_kv_source, one lookup of every key, then one load of every row
the peer reported. The bench checks every byte that landed, and prints the
lookup round trip and the load's GB/s per round, with a progress bar, then
the medians. Nothing of vLLM is involved. Exit status 0 when every round
pulled every row intact.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import uuid

from peerkv import _standalone

HELP = "pull synthetic rows from a `peerkv serve` peer: GB/s and lookup round trip"
EPILOG = """examples:
  peerkv serve --host 10.0.0.7 --port 5710            # on one machine
  peerkv bench 10.0.0.7:5710 --rounds 20              # on another
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("peer", metavar="HOST:PORT", help="a peer started with `peerkv serve`")
    parser.add_argument("--rows", type=int, default=_standalone.DEFAULT_ROWS, help="rows per round (default 256)")
    parser.add_argument("--row-len", type=int, default=_standalone.DEFAULT_ROW_LEN,
                        help="bytes per row: the serve's --row-len (default 2 MiB)")
    parser.add_argument("--rounds", type=int, default=10, help="pulls to time (default 10)")
    parser.add_argument("--host", help="our address the peer dials back (default: the route to the peer)")
    parser.add_argument("--data-transport", help='"auto" (default), "tcp" or "nixl"')
    parser.add_argument("--auth-secret-file", help="the cluster's shared secret, in a file")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds one round may take (default 30)")


def _bar(done: int, total: int, text: str) -> None:
    width = 30
    filled = width * done // total
    sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total} {text}   ")
    sys.stderr.flush()


class Puller:
    def __init__(self, node, endpoint: str, rows: int, row_len: int) -> None:
        self.node, self.rows, self.row_len = node, rows, row_len
        self.host, self.port = _standalone.split_endpoint(endpoint)
        self.keys = [_standalone.key(i) for i in range(rows)]
        self.job = 0

    def round(self, region, timeout: float) -> tuple[float, float, int]:
        """(lookup seconds, load seconds, bytes) of one pull; raises on failure."""
        req = f"bench-{uuid.uuid4().hex[:12]}"
        params = {"remote_kv_source": {"kv_request_id": req, "remote_host": self.host, "remote_port": self.port}}
        self.node.request_start(req, params)
        try:
            deadline = time.monotonic() + timeout
            if self.node.lookup_mode(req) != 2:  # LOOKUPS_ASK
                raise RuntimeError(f"cannot pull from {self.host}:{self.port} (see the log lines above)")
            start = time.monotonic()
            told = list(self.node.lookup_many([(req, self.keys)]))
            while 4 in told:  # LOOKUP_RETRY
                if time.monotonic() > deadline:
                    raise RuntimeError("the peer did not answer the lookup in time")
                time.sleep(0.0002)
                for change in self.node.take_answers():
                    if change.failed:
                        raise RuntimeError("the pull failed (see the log lines above)")
                    for pos, code in zip(change.positions, change.results):
                        told[pos] = code
            lookup_s = time.monotonic() - start
            missing = [i for i, code in enumerate(told) if code != 2]
            if missing:
                raise RuntimeError(f"the peer does not hold {len(missing)} of the rows (is it `peerkv serve` "
                                   f"with --rows >= {self.rows} and --row-len {self.row_len}?)")
            self.job += 1
            start = time.monotonic()
            self.node.submit_load(req, self.job, self.keys, list(range(self.rows)))
            result = self._wait_job(self.job, deadline)
            load_s = time.monotonic() - start
            if not result.success:
                raise RuntimeError("the load failed (see the log lines above)")
            for i in range(self.rows):
                if region[i * self.row_len : (i + 1) * self.row_len] != _standalone.row(i, self.row_len):
                    raise RuntimeError(f"row {i} arrived corrupted")
            return lookup_s, load_s, result.bytes or self.rows * self.row_len
        finally:
            self.node.request_finish(req)

    def _wait_job(self, job: int, deadline: float):
        while time.monotonic() < deadline:
            for result in self.node.get_finished():
                if result.job_id == job:
                    return result
            time.sleep(0.0002)
        raise RuntimeError("the load did not finish in time")


def run(args: argparse.Namespace) -> int:
    from peerkv.errors import PeerKVError
    from peerkv.node import Node

    try:
        host, port = _standalone.split_endpoint(args.peer)
        if args.rows <= 0 or args.row_len <= 0 or args.rounds <= 0:
            raise ValueError("--rows, --row-len and --rounds must be positive")
        local = args.host or _standalone.local_address(host, port)
    except (OSError, ValueError) as exc:
        print(f"peerkv bench: {exc}", file=sys.stderr)
        return 2
    region = _standalone.region(args.rows, args.row_len)
    # data_port 0: this client's data listener is ephemeral (port + 1000 may be another node's).
    options = {"host": local, "port": _standalone.free_port(local), "data_port": 0, "key_len": _standalone.KEY_LEN,
               **_standalone.secret_options(args)}
    lookups, rates = [], []
    try:
        with Node(region, args.rows, args.row_len, options) as node:
            puller = Puller(node, args.peer, args.rows, args.row_len)
            try:
                puller.round(region, args.timeout)  # warm-up: handshake, data-path registration
                for n in range(args.rounds):
                    region[:] = bytes(len(region))  # every round must land every byte anew
                    lookup_s, load_s, nbytes = puller.round(region, args.timeout)
                    lookups.append(lookup_s * 1000)
                    rates.append(nbytes / load_s / 1e9)
                    _bar(n + 1, args.rounds, f"lookup {lookups[-1]:.2f} ms, load {rates[-1]:.2f} GB/s")
            except RuntimeError as exc:
                sys.stderr.write("\n")
                for line in node.take_logs():
                    print(f"peerkv bench: {line}", file=sys.stderr)
                print(f"peerkv bench: {exc}", file=sys.stderr)
                return 1
            paths = node.stats().get("paths") or {}
    except PeerKVError as exc:
        print(f"peerkv bench: {exc}", file=sys.stderr)
        return 1
    sys.stderr.write("\n")
    used = ", ".join(name for name, entry in paths.items() if (entry or {}).get("loads")) or "?"
    print(f"peerkv bench: {args.peer}: {args.rounds} pulls of {args.rows} rows x {args.row_len} bytes over {used}: "
          f"load median {statistics.median(rates):.2f} GB/s (max {max(rates):.2f}), "
          f"lookup round trip median {statistics.median(lookups):.2f} ms (max {max(lookups):.2f}); every byte checked")
    return 0

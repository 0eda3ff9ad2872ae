"""A test/dev orchestrator (not llm-d) for peerkv's PD and P2P: an HTTP proxy in
front of `vllm serve` engines that sets each request's kv_transfer_params,
health-checks the engines and routes around dead ones.

The command line of `peerkv proxy` and `python -m peerkv_proxy`.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
from typing import Any

from peerkv_proxy.logs import log
from peerkv_proxy.routing import (
    DEFAULT_P2P_PORT,
    ORDERS,
    ROUTES,
    ConfigError,
    ProxyConfig,
    parse_endpoint,
    split_host_port,
)
from peerkv_proxy.server import ProxyServer

HELP = "test/dev orchestrator (not llm-d): an HTTP proxy that sets kv_transfer_params for PD and P2P"
EPILOG = """\
request headers (addresses must name a configured engine's serving address, else they are ignored):
  x-prefiller-host-port: HOST:PORT[,...]   PD with that prefiller
  x-kv-cache-source-host-port: HOST:PORT   P2P pull from that engine (llm-d's EPP sets it)
  x-peerkv-target: URL                     send the request (decode leg) to that --engine
GET /health: the pool, 200 while some --engine is healthy, else 503 (JSON: each engine's state)
response headers: x-peerkv-target, x-peerkv-mode (local, p2p, pd, pd+p2p, pd-fallback),
  x-peerkv-kv-request-id, x-peerkv-prefiller, x-peerkv-kv-source

example:
  peerkv proxy --listen 127.0.0.1:8000 --prefiller http://10.0.0.1:8100 \\
      --engine http://10.0.0.2:8200 --p2p-connector-port 5710
"""


def _env_port() -> int:
    text = os.environ.get("P2P_CONNECTOR_PORT", "")
    return int(text) if text.isdigit() else DEFAULT_P2P_PORT


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", default="127.0.0.1:8000", metavar="HOST:PORT",
                        help="address to serve on (default %(default)s; port 0 picks one)")
    parser.add_argument("--engine", action="append", default=[], metavar="URL[=KVHOST:KVPORT]",
                        help="a decode/serving engine's HTTP base URL; repeat for each. Its KV endpoint (the "
                             "peerkv tier's host:port) defaults to URL's host and --p2p-connector-port. "
                             "Required")
    parser.add_argument("--prefiller", action="append", default=[], metavar="URL[=KVHOST:KVPORT]",
                        help="a prefill engine; with any, every request gets a prefill and a decode leg")
    parser.add_argument("--p2p-connector-port", type=int, default=_env_port(), metavar="PORT",
                        help="KV port of engines given without =KVHOST:KVPORT; must equal the tier's `port` "
                             "(default $P2P_CONNECTOR_PORT or %(default)s)")
    parser.add_argument("--order", choices=ORDERS, default="prefiller-first",
                        help="PD dispatch: prefill completes, then decode (default); or decode first, "
                             "prefill concurrently")
    parser.add_argument("--route", choices=ROUTES, default="round-robin",
                        help="round-robin: P2P only from the x-kv-cache-source-host-port header (default); "
                             "prefix: also pull a prompt's prefix from the engine that last computed it")
    parser.add_argument("--prefix-chunk-chars", type=int, default=128, metavar="N",
                        help="--route prefix: characters per prompt chunk (default %(default)s)")
    parser.add_argument("--prefix-cache-size", type=int, default=65536, metavar="N",
                        help="--route prefix: fingerprints remembered, LRU (default %(default)s)")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="SECONDS",
                        help="upstream read timeout: longest silence from a backend (default %(default)s)")
    parser.add_argument("--connect-timeout", type=float, default=10.0, metavar="SECONDS",
                        help="upstream connect timeout (default %(default)s)")
    parser.add_argument("--health-interval", type=float, default=5.0, metavar="SECONDS",
                        help="GET /health of every engine this often (default %(default)s)")
    parser.add_argument("--health-timeout", type=float, default=5.0, metavar="SECONDS",
                        help="a health check not answered in this time fails (default %(default)s)")
    parser.add_argument("--health-failures", type=int, default=2, metavar="N",
                        help="failed checks in a row that eject an engine until a check passes; a leg that "
                             "cannot connect ejects it at once (default %(default)s)")
    parser.add_argument("--drain-timeout", type=float, default=30.0, metavar="SECONDS",
                        help="on SIGINT/SIGTERM, wait this long for requests in flight (default %(default)s)")
    parser.add_argument("--no-peerkv-headers", dest="peerkv_headers", action="store_false",
                        help="omit the x-peerkv-* response headers (they show kv_request_id to clients)")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))


def config_from_args(args: argparse.Namespace) -> ProxyConfig:
    engines = [parse_endpoint(spec, args.p2p_connector_port) for spec in args.engine]
    prefillers = [parse_endpoint(spec, args.p2p_connector_port) for spec in args.prefiller]
    return ProxyConfig(
        engines=engines,
        prefillers=prefillers,
        order=args.order,
        route=args.route,
        timeout_s=args.timeout,
        connect_timeout_s=args.connect_timeout,
        prefix_chunk_chars=args.prefix_chunk_chars,
        prefix_cache_size=args.prefix_cache_size,
        peerkv_headers=args.peerkv_headers,
        health_interval_s=args.health_interval,
        health_timeout_s=args.health_timeout,
        health_failures=args.health_failures,
    )


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        config = config_from_args(args)
        host, port = split_host_port(args.listen, allow_zero=True)
    except (ConfigError, ValueError) as exc:
        log.error("bad configuration: %s", exc)
        return 2
    try:
        server = ProxyServer((host, port), config)
    except OSError as exc:
        log.error("cannot listen on %s: %s", args.listen, exc)
        return 1
    return serve(server, args.drain_timeout)


def serve(server: ProxyServer, drain_timeout_s: float) -> int:
    """Serves until SIGINT/SIGTERM, then drains; a second signal exits at once."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        if stop.is_set():
            log.warning("second %s: exiting now", signal.Signals(signum).name)
            os._exit(1)
        log.info("%s: stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    config = server.config
    for ep in config.engines:
        log.info("engine %s, KV endpoint %s", ep.url, ep.kv_address)
    for ep in config.prefillers:
        log.info("prefiller %s, KV endpoint %s", ep.url, ep.kv_address)
    pd = f"PD {config.order}" if config.prefillers else "no prefillers"
    log.info("listening on %s (%s, route %s)", server.url, pd, config.route)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="peerkv-proxy")
    thread.start()
    while not stop.wait(0.5):
        pass
    drained = server.stop(drain_timeout_s)
    thread.join()
    if not drained:
        log.warning("requests still in flight after %.0fs: exiting anyway", drain_timeout_s)
    log.info("stopped")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m peerkv_proxy`: the same command as `peerkv proxy`."""
    parser = argparse.ArgumentParser(prog="peerkv proxy", description=HELP, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))

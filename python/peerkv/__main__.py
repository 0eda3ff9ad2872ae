"""`peerkv` / `python -m peerkv`: peerkv's command-line tools.

Each subcommand is a module with HELP, add_arguments(parser) and
run(args) -> exit status, listed in SUBCOMMANDS. None of them loads
libpeerkv.so unless it needs to.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> module.
SUBCOMMANDS = {
    "proxy": "peerkv_proxy.cli",  # its own package: vLLM workers never import it
    "info": "peerkv.info_cli",
    "check-config": "peerkv.check_config",
    "doctor": "peerkv.doctor",
    "peers": "peerkv.peers_cli",
    "links": "peerkv.links_cli",
    "serve": "peerkv.serve_cli",
    "bench": "peerkv.bench_cli",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="peerkv", description="peerkv: a peer-to-peer KV-cache tier for vLLM"
    )
    from peerkv import __version__

    parser.add_argument("--version", action="version", version=f"peerkv {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, module_name in SUBCOMMANDS.items():
        module = importlib.import_module(module_name)
        doc = (module.__doc__ or "").strip()
        sub = commands.add_parser(
            name,
            help=module.HELP,
            description=doc.split("\n\n", 1)[0].replace("\n", " ") if doc else module.HELP,
            epilog=getattr(module, "EPILOG", None),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(sub)
        sub.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args._run(args)


if __name__ == "__main__":
    sys.exit(main())

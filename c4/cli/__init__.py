"""The `c4` command. Each subcommand lives in c4/cli/commands/<name>.py and registers itself."""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from c4 import __version__

COMMANDS = ("agent", "aggregator", "hosts", "incidents", "keys", "lab", "plan", "replay", "sim",
            "topology")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="c4", description="c4: eBPF/RDMA observability, fault localisation (C4D) and "
        "traffic planning (C4P) for GPU training clusters. See docs/cli.md.")
    p.add_argument("--version", action="version", version=f"c4 {__version__}")
    p.add_argument("-v", "--verbose", action="count", default=0, help="more log output")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        importlib.import_module(f"c4.cli.commands.{name}").register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    level = logging.WARNING - 10 * args.verbose
    if getattr(args, "daemon", False):
        level = min(level, logging.INFO)
    logging.basicConfig(level=level, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `c4 hosts | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


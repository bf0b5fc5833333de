"""`c4 aggregator run`: ingest, state, diagnosis, API."""
from __future__ import annotations

import argparse

from c4.core import config

from ._daemon import add_run, start


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    r = add_run(sub, "aggregator", "the central aggregator", "run the aggregator in the foreground",
                "Run the aggregator: ZeroMQ ingest, host state, C4D, HTTP JSON API and /metrics. "
                "Config keys: docs/config.md.", "aggregator TOML config (default: all defaults)")
    r.set_defaults(func=_run, daemon=True)


def _run(args: argparse.Namespace) -> int:
    from c4.aggregator.config import AggregatorConfig
    from c4.aggregator.server import run

    return start("aggregator", lambda: config.load(AggregatorConfig, args.config), run)

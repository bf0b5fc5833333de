"""`c4 aggregator run`: ingest, state, diagnosis, API."""
from __future__ import annotations

import argparse

from c4.core import config
from ._http import fail


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("aggregator", help="the central aggregator",
                       description="The central aggregator.")
    asub = p.add_subparsers(dest="aggregator_command", metavar="ACTION")
    asub.required = True
    r = asub.add_parser("run", help="run the aggregator in the foreground",
                        description="Run the aggregator: ZeroMQ ingest, host state, C4D, "
                        "HTTP JSON API and /metrics. Config keys: docs/config.md.")
    r.add_argument("--config", metavar="FILE",
                   help="aggregator TOML config (default: all defaults)")
    r.set_defaults(func=_run, daemon=True)


def _run(args: argparse.Namespace) -> int:
    import zmq

    from c4.aggregator.config import AggregatorConfig
    from c4.aggregator.server import run

    try:
        cfg = config.load(AggregatorConfig, args.config)
        return run(cfg)
    except config.ConfigError as exc:
        return fail(str(exc), 2)
    except (OSError, zmq.ZMQError) as exc:  # a port in use, an unwritable database directory
        return fail(f"cannot start the aggregator: {exc}", 1)

"""`c4 agent run`: the per-host daemon."""
from __future__ import annotations

import argparse

from c4.core import config
from ._http import fail


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("agent", help="the per-host agent", description="The per-host agent.")
    asub = p.add_subparsers(dest="agent_command", metavar="ACTION")
    asub.required = True
    r = asub.add_parser("run", help="run the agent in the foreground (systemd: c4-agent.service)",
                        description="Run the agent: collectors -> reports -> aggregator. "
                        "Stops cleanly on SIGTERM. Config keys: docs/config.md.")
    r.add_argument("--config", metavar="FILE", help="agent TOML config (default: all defaults)")
    r.add_argument("--record", metavar="FILE",
                   help="append every frame sent to FILE (replay it with `c4 replay FILE`)")
    r.set_defaults(func=_run, daemon=True)


def _run(args: argparse.Namespace) -> int:
    import zmq

    from c4.agent.config import AgentConfig
    from c4.agent.daemon import run

    try:
        cfg = config.load(AgentConfig, args.config)
        return run(cfg, record_path=args.record)
    except config.ConfigError as exc:
        return fail(str(exc), 2)
    except (OSError, zmq.ZMQError) as exc:  # an endpoint ZeroMQ cannot parse, an unwritable --record
        return fail(f"cannot start the agent: {exc}", 1)

"""`c4 agent run`: the per-host daemon."""
from __future__ import annotations

import argparse

from c4.core import config

from ._daemon import add_run, start


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    r = add_run(sub, "agent", "the per-host agent",
                "run the agent in the foreground (systemd: c4-agent.service)",
                "Run the agent: collectors -> reports -> aggregator. Stops cleanly on SIGTERM. "
                "Config keys: docs/config.md.", "agent TOML config (default: all defaults)")
    r.add_argument("--record", metavar="FILE",
                   help="append every frame sent to FILE (replay it with `c4 replay FILE`)")
    r.set_defaults(func=_run, daemon=True)


def _run(args: argparse.Namespace) -> int:
    from c4.agent.config import AgentConfig
    from c4.agent.daemon import run

    return start("agent", lambda: config.load(AgentConfig, args.config),
                 lambda cfg: run(cfg, record_path=args.record))

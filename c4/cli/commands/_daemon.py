"""What `c4 agent run` and `c4 aggregator run` share: the `NAME run --config FILE` parser and
the mapping of start-up failures to exit codes (2: configuration, systemd does not restart;
1: the environment, e.g. a port in use)."""
from __future__ import annotations

import argparse
from typing import Any, Callable

from c4.core import config

from ._http import fail


def add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, help: str,
            run_help: str, description: str, config_help: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".")
    asub = p.add_subparsers(dest=f"{name}_command", metavar="ACTION")
    asub.required = True
    r = asub.add_parser("run", help=run_help, description=description)
    r.add_argument("--config", metavar="FILE", help=config_help)
    return r


def start(what: str, load: Callable[[], Any], run: Callable[[Any], int]) -> int:
    import zmq

    try:
        cfg = load()
        return run(cfg)
    except config.ConfigError as exc:
        return fail(str(exc), 2)
    except (OSError, zmq.ZMQError) as exc:  # a port in use, an unwritable path, a bad endpoint
        return fail(f"cannot start the {what}: {exc}", 1)

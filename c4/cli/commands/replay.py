"""`c4 replay FILE`: reproduce host state and incidents from a recorded frame stream."""
from __future__ import annotations

import argparse

from rich.console import Console

from ._http import fail, print_json


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "replay", help="replay a recorded frame stream through ingest and diagnosis",
        description="Feed a recording (`c4 agent run --record`, `c4 sim`) through the same "
        "ingest and detectors as a live aggregator, on simulated time from the frames' "
        "timestamps, and print the resulting hosts and incidents. Deterministic: the same file "
        "gives the same output. Actions are always dry-run.")
    p.add_argument("file", help="recording to replay")
    p.add_argument("--topology", metavar="FILE",
                   help="topology JSON (default: FILE.topology.json beside the recording)")
    p.add_argument("--config", metavar="FILE",
                   help="aggregator TOML config whose [diagnosis] thresholds to use")
    p.add_argument("--measured", action="store_true",
                   help="answer C4D's measuring probes from the recording's own probe results "
                        "(what the live C4D's legs measured; a leg the live run never asked "
                        "stays unanswered); needs the topology")
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=_replay)


def _replay(args: argparse.Namespace) -> int:
    from c4.aggregator.config import AggregatorConfig
    from c4.aggregator.replay import replay
    from c4.core import config, record

    from .hosts import hosts_table

    try:
        cfg = config.load(AggregatorConfig, args.config) if args.config else None
        result = replay(args.file, topology=args.topology, cfg=cfg, measured=args.measured)
    except (config.ConfigError, record.RecordError, ValueError) as exc:
        return fail(str(exc), 2)
    except OSError as exc:
        return fail(f"cannot read {args.file}: {exc.strerror or exc}", 2)
    if args.json:
        print_json(result.to_json())
        return 0
    console = Console()
    console.print(f"replayed {result.frames} frames, simulated "
                  f"{result.sim_end - result.sim_start:.1f}s; rejected: "
                  f"{sum(result.stats['rejected'].values())}, duplicates: "
                  f"{result.stats['duplicates']}")
    console.print(hosts_table(result.hosts))
    from c4.cli.render import incidents_table

    console.print(incidents_table(result.incidents))
    return 0

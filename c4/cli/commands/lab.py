"""`c4 lab`: a routed leaf-spine fabric in network namespaces on this machine, with an
aggregator, one agent per host, collective workloads and injected faults (docs/lab.md)."""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable

from c4.core.topology import TopologyError


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser(
        "lab", help="emulate a GPU cluster's fabric on this machine (root)",
        description="Build a leaf-spine fabric of network namespaces (real Linux ECMP, TCP, "
        "eBPF), run c4 on it, run collective jobs and inject faults. Needs root. See "
        "docs/lab.md.")
    lab = p.add_subparsers(dest="lab_command", metavar="ACTION")
    lab.required = True

    def prefix_arg(q: argparse.ArgumentParser) -> None:
        q.add_argument("--prefix", default="c4lab",
                       help="name prefix of the lab's namespaces, cgroups and state (default "
                       "c4lab); labs with different prefixes coexist")

    q = lab.add_parser("up", help="build the fabric and start the aggregator and agents",
                       description="Build the fabric from a topology file, start one "
                       "aggregator and one agent per host (in the host's namespace), and the "
                       "pump that advances each host's RDMA sysfs counters from its traffic.")
    q.add_argument("--topology", metavar="FILE",
                   help="topology JSON (c4/core/topology.py) or a shipped name: default (8 "
                   "hosts, 4 leaves, 2 spines), hosts16, rails2, leaves2")
    prefix_arg(q)
    q.add_argument("--ebpf", action="store_true",
                   help="also run the agents' eBPF tcp_flows collector (needed for jobs "
                   "without the plugin, such as `c4 lab gloo`; compiling it costs CPU)")
    q.add_argument("--interval", type=float, default=1.0, help="agent report interval (s)")
    q.add_argument("--json", action="store_true", help="print the lab's state as JSON")
    q.set_defaults(func=_up)

    q = lab.add_parser("down", help="remove the lab: processes, namespaces, cgroups, state",
                       description="Remove everything lab PREFIX made, also after a crashed "
                       "or killed `c4 lab up` (found by name prefix and process marker).")
    prefix_arg(q)
    q.add_argument("--json", action="store_true", help="print what was removed as JSON")
    q.set_defaults(func=_down)

    q = lab.add_parser("status", help="labs on this machine: processes, faults, runs",
                       description="Show each lab (or one): phase, processes alive, the "
                       "aggregator's URL, active faults, workloads, open incidents.")
    q.add_argument("--prefix", help="only this lab")
    q.add_argument("--json", action="store_true", help="print JSON")
    q.set_defaults(func=_status)


def _guard(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        from c4.lab.fabric import FabricError
        from c4.lab.state import LabError

        try:
            return fn(args)
        except (LabError, FabricError, TopologyError) as exc:
            print(f"c4 lab {args.lab_command}: {exc}", file=sys.stderr)
            return 2
        except PermissionError as exc:
            print(f"c4 lab {args.lab_command}: {exc} (the lab needs root)", file=sys.stderr)
            return 2
    return run


def _say(args: argparse.Namespace) -> Callable[[str], None]:
    stream = sys.stderr if getattr(args, "json", False) else sys.stdout
    return lambda s: print(s, file=stream, flush=True)


def _print(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=True, default=str)
    print()


@_guard
def _up(args: argparse.Namespace) -> int:
    from c4.lab import control

    collectors = control.DEFAULT_COLLECTORS + (("tcp_flows",) if args.ebpf else ())
    st = control.up(args.topology, args.prefix, collectors, args.interval, say=_say(args))
    if args.json:
        _print(control.status(st.prefix)[0])
    else:
        print(f"lab {st.prefix} up in {st.data['ready_s']} s: aggregator {st.api}\n"
              f"  try: c4 hosts --aggregator {st.api}   |   c4 lab run --prefix {st.prefix}")
    return 0


@_guard
def _down(args: argparse.Namespace) -> int:
    from c4.lab import control

    removed = control.down(args.prefix, say=_say(args))
    if args.json:
        _print(removed)
    return 0


@_guard
def _status(args: argparse.Namespace) -> int:
    from c4.lab import control

    labs = control.status(args.prefix)
    if args.json:
        _print({"labs": labs})
        return 0
    if not labs:
        print("no lab is up")
    for lab in labs:
        print(f"{lab['prefix']}: {lab['phase']}, {lab['namespaces']} namespaces, agents "
              f"{lab['agents_alive']}/{lab['agents']}, aggregator "
              f"{'up' if lab['aggregator_alive'] else 'DOWN'} at {lab['api']}, "
              f"open incidents {lab['incidents_open']}")
        for f in lab["faults_active"]:
            print(f"  fault {f['id']}: {f['kind']} {f['target']} since {f['injected']:.0f}")
        for rid, r in lab["runs"].items():
            print(f"  run {rid}: {r.get('kind')} {r.get('state')}")
    return 0

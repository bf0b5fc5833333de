"""`c4 topology check FILE`: validate a topology file, each problem with its line."""
from __future__ import annotations

import argparse
from pathlib import Path

from ._http import fail, print_json


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("topology", help="topology files", description="Topology files "
                       "(format: docs/planning.md).")
    tsub = p.add_subparsers(dest="topology_command", metavar="ACTION")
    tsub.required = True
    c = tsub.add_parser("check", help="validate a topology file",
                        description="Check a topology JSON file: unknown switches, duplicate "
                        "names, links between planes, addresses two nodes claim, leaves without "
                        "uplinks, oversubscription, paths that are not chains. Prints each "
                        "problem with its line; exit status 1 when any is an error.")
    c.add_argument("file", help="topology JSON file")
    c.add_argument("--json", action="store_true", help="print JSON for scripts")
    c.set_defaults(func=_check)


def _check(args: argparse.Namespace) -> int:
    from c4.core.topology import check_text

    try:
        text = Path(args.file).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        return fail(f"cannot read {args.file}: {exc}", 2)
    topo, problems = check_text(text)
    errors = sum(1 for p in problems if p.level == "error")
    summary = None
    if topo is not None:
        summary = {"hosts": len(topo.hosts), "nic_ports": sum(len(h.nics) for h in
                                                              topo.hosts.values()),
                   "leaves": len(topo.leaves), "spines": len(topo.spines),
                   "cores": len(topo.cores), "links": len(topo.links),
                   "planes": len({s.plane for s in topo.switches.values()})}
    if args.json:
        print_json({"file": args.file, "ok": errors == 0, "summary": summary,
                    "problems": [{"level": p.level, "line": p.line, "msg": p.msg}
                                 for p in problems]})
    else:
        for p in problems:
            print(f"{args.file}:{p.line or '-'}: {p.level}: {p.msg}")
        if summary is not None:
            print(f"{args.file}: {summary['hosts']} hosts, {summary['nic_ports']} NIC ports, "
                  f"{summary['leaves']} leaves, {summary['spines']} spines, "
                  f"{summary['cores']} cores, {summary['links']} links; {errors} error(s), "
                  f"{len(problems) - errors} warning(s)")
    return 1 if errors else 0

"""`c4 plan` and `c4 plan apply`: C4P's proposal (current vs proposed link loads, the flows
that move) and pushing it to the agents."""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from rich.console import Group
from rich.markup import escape
from rich.table import Table

from ._http import ApiError, add_aggregator_arg, fail, get_json, print_json
from ._http import query as http_query


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("plan", help="C4P traffic plan", description="Show the planner's "
                       "proposal: the busiest links now and after the plan, side by side, and "
                       "which flows move to which source port; the last applied plan and what "
                       "the agents reported back.")
    add_aggregator_arg(p)
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.add_argument("--links", type=int, default=20, metavar="N",
                   help="busiest links to show (default 20)")
    p.set_defaults(func=_show)
    psub = p.add_subparsers(dest="plan_command", metavar="ACTION")
    a = psub.add_parser("apply", help="push the proposal to the agents",
                        description="Push the current proposal: each host whose flows move gets "
                        "a plan frame; `c4 plan` then shows what took effect. Needs the "
                        "aggregator's API token.")
    add_aggregator_arg(a)
    a.add_argument("--token-file", metavar="FILE",
                   default=os.environ.get("C4_API_TOKEN_FILE"),
                   help="file holding the API bearer token (env C4_API_TOKEN_FILE; "
                   "or the token itself in env C4_API_TOKEN)")
    a.add_argument("--json", action="store_true", help="print JSON for scripts")
    a.set_defaults(func=_apply)


def _show(args: argparse.Namespace) -> int:
    return http_query(args, "/api/v1/plan", lambda d: plan_view(d, args.links))


def _apply(args: argparse.Namespace) -> int:
    token = os.environ.get("C4_API_TOKEN", "")
    if args.token_file:
        try:
            token = Path(args.token_file).read_text().strip()
        except OSError as exc:
            return fail(f"cannot read the token file: {exc}", 2)
    try:
        out = get_json(args.aggregator, "/api/v1/plan/apply", timeout=30, post_token=token)
    except ApiError as exc:
        return fail(str(exc))
    if args.json:
        print_json(out)
    elif out.get("plan_id"):
        print(f"{out['plan_id']}: {out['assignments']} assignment(s) sent to "
              f"{len(out['hosts'])} host(s) ({out.get('reason')})")
    else:
        print(f"nothing applied: {out.get('reason')}")
    return 0


def _u(x: float | None) -> str:
    if x is None:
        return "-"
    colour = "red" if x > 1.0 else "yellow" if x > 0.8 else "green"
    return f"[{colour}]{100 * x:.0f}%[/]"


def plan_view(d: dict[str, Any], links: int = 20) -> Group:
    parts: list[Any] = []
    h = d.get("health", {})
    parts.append(f"flows {d.get('flows', 0)}, known paths {d['pathmap']['entries']}, probes "
                 f"pending {d['pathmap']['probes_pending']}, links down "
                 f"{', '.join(h.get('down', [])) or 'none'}, suspect "
                 f"{', '.join(h.get('suspect', {})) or 'none'}"
                 + ("  [bold]auto-apply on[/]" if d.get("auto_apply") else ""))
    p = d.get("proposal")
    if p is None:
        parts.append("no proposal: no flow with a known path yet")
    else:
        parts.append(f"[bold]proposal[/] ({escape(p['reason'])}): busiest link "
                     f"{_u(p['current_max_util'])} now -> {_u(p['proposed_max_util'])}, "
                     f"{p['moved']} of {p['planned']} flows move, {p['unplanned']} not planned"
                     + (f" ({', '.join(f'{k}: {v}' for k, v in p['unplanned_reasons'].items())})"
                        if p["unplanned_reasons"] else "") + f", {p['plan_ms']} ms"
                     + ((", gains enough to apply on its own" if p.get("gains") else
                         ", gain below the auto-apply margin") if d.get("auto_apply") else ""))
        t = Table(title="busiest links (utilisation per direction)")
        for col in ("link", "direction", "Gb/s", "now", "planned", "health"):
            t.add_column(col, justify="right" if col in ("Gb/s", "now", "planned") else "left")
        for r in p["links"][:links]:
            t.add_row(r["link"], f"{r['from']} -> {r['to']}", f"{r['gbps']:g}",
                      _u(r["current"]), _u(r["proposed"]), r["health"])
        parts.append(t)
        if p["moves"]:
            m = Table(title=f"flows that move ({p['moved']})")
            for col in ("flow", "host", "proto", "port", "new path"):
                m.add_column(col)
            for mv in p["moves"]:
                m.add_row(escape(mv["flow"]), mv["host"], mv["proto"],
                          f"{mv['from'] if mv['from'] is not None else '?'} -> {mv['to']}",
                          escape(" ".join(x for x in mv["to_path"][1:-1]) or "(same leaf)"))
            parts.append(m)
    last = d.get("last_plan")
    if last:
        parts.append(f"[bold]last applied[/] {last['id']} ({escape(last['reason'])}): "
                     f"{last['applied']}/{last['assignments']} in effect, "
                     f"{len(last['failed'])} failed, {len(last['waiting'])} waiting")
        for f in last["failed"][:20]:
            parts.append(f"  [red]failed[/] {escape(f['host'])} {escape(f['id'])}: "
                         f"{escape(f['reason'])}")
    return Group(*parts)

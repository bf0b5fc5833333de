"""`c4 incidents` and `c4 incident ID`: C4D incidents from the aggregator's API."""
from __future__ import annotations

import argparse
import time
from urllib.parse import urlencode

from c4.cli.render import incident_view, incidents_table

from ._http import add_aggregator_arg
from ._http import query as http_query

STATES = ("open", "mitigated", "resolved")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("incidents", help="list incidents", description="List C4D incidents, newest "
                       "first: state, class, job, top suspect with confidence, age, summary.")
    p.add_argument("--state", choices=STATES, help="only incidents in this state (default: all)")
    add_aggregator_arg(p)
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=_incidents)
    p = sub.add_parser("incident", help="show one incident", description="Show one incident: "
                       "summary, times, ranked suspects, evidence, actions taken and a heatmap of "
                       "the latency matrix around the suspect.")
    p.add_argument("id", type=int, help="incident id (from `c4 incidents`)")
    add_aggregator_arg(p)
    p.add_argument("--json", action="store_true", help="print JSON for scripts")
    p.set_defaults(func=_incident)


def _incidents(args: argparse.Namespace) -> int:
    query = f"?{urlencode({'state': args.state})}" if args.state else ""
    return http_query(args, f"/api/v1/incidents{query}",
                      lambda d: incidents_table(d.get("incidents", []), time.time()))


def _incident(args: argparse.Namespace) -> int:
    return http_query(args, f"/api/v1/incidents/{args.id}",
                      lambda d: incident_view(d, time.time()))

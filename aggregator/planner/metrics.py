"""C4P on /metrics: the utilisation of each directed link as the flows are placed now and as the
planner's latest proposal would place them (docs/planning.md, "Policy and commands").

- `c4_plan_link_load{link, direction, state}`: load / capacity of link `link` in `direction`
  (`ab`: from the link's `a` end to its `b` end), `state` `current` or `planned`. Only links
  some planned flow's candidate paths can load appear; an idle link is absent, not 0.
- `c4_plan_max_link_load{state}`: the busiest of them (the planner's objective).
- `c4_plan_flows{state}`: flows in the proposal, `planned` or `unplanned` (left alone: no path
  known yet, too small to move).

The proposal is the one the planner last made (every `interval_s`, on `c4 plan`, on a link
incident); none after a plan was applied until the next one, and then these series are absent.
"""
from __future__ import annotations

import threading
from typing import Any, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric

from .service import Planner, _arc_util


def link_loads(planner: Planner) -> list[tuple[str, str, float, float]]:
    """(link, direction, current, planned) utilisation per directed link of the latest
    proposal; current is the flows' present paths (unknown ones count nowhere)."""
    p = planner.proposal
    if p is None:
        return []
    b = p.built
    cur, new = _arc_util(b, b.current), _arc_util(b, p.result.assign)
    out = []
    for a in sorted(set(cur) | set(new)):
        lid, fwd = b.arcs[a]
        out.append((lid, "ab" if fwd else "ba", cur.get(a, 0.0), new.get(a, 0.0)))
    return out


class PlanMetrics:
    """prometheus_client custom collector, read at scrape time under the aggregator lock."""

    def __init__(self, lock: threading.Lock, planner: Planner) -> None:
        self.lock = lock
        self.planner = planner

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            rows = link_loads(self.planner)
            p = self.planner.proposal
            counts: dict[str, Any] = ({"planned": len(p.built.flows),
                                       "unplanned": len(p.built.unplanned)} if p else {})
        load = GaugeMetricFamily("c4_plan_link_load", "Utilisation (load / capacity) of a "
                                 "directed link with the flows where they are (current) and "
                                 "where the latest proposal puts them (planned)",
                                 labels=["link", "direction", "state"])
        top = GaugeMetricFamily("c4_plan_max_link_load", "The busiest directed link's "
                                "utilisation, current and planned", labels=["state"])
        for lid, d, cur, new in rows:
            load.add_metric([lid, d, "current"], cur)
            load.add_metric([lid, d, "planned"], new)
        if rows:
            top.add_metric(["current"], max(r[2] for r in rows))
            top.add_metric(["planned"], max(r[3] for r in rows))
        flows = GaugeMetricFamily("c4_plan_flows", "Flows in the latest proposal: planned, "
                                  "or left alone (unplanned)", labels=["state"])
        for k, v in counts.items():
            flows.add_metric([k], v)
        yield load
        yield top
        yield flows

"""C4P link loads on /metrics: two connections hashed onto one spine, current vs planned."""
from __future__ import annotations

import threading

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from c4.aggregator.planner.metrics import PlanMetrics
from tests.promtool import check_metrics

from .test_planner_service import colliding, planner

SRC, DST = "node000/mlx5_0", "node002/mlx5_0"


def scrape(reg: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(generate_latest(reg).decode()):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_link_loads_current_and_planned() -> None:
    p, t = planner()
    reg = CollectorRegistry(auto_describe=False)
    reg.register(PlanMetrics(threading.Lock(), p))
    assert not any(k[0].startswith("c4_plan_link_load") for k in scrape(reg))  # no proposal yet
    same = colliding(p, t)  # 2 x 5 GB/s from node000 to node002, both via leaf000-spine00
    for sp in list(range(41000, 41016)) + same:
        p.pathmap.learn(SRC, DST, "tcp:29500", sp,
                        t.ecmp_path(SRC, DST, "tcp", sp, 29500), 1.0)
    p.view(2.0)
    check_metrics(generate_latest(reg).decode())  # lints clean, as the aggregator's others
    m = scrape(reg)

    def load(link: str, direction: str, state: str) -> float:
        return m[("c4_plan_link_load",
                  (("direction", direction), ("link", link), ("state", state)))]

    cap = t.links["leaf000-spine00"].gbps * 1e9 / 8
    assert load("leaf000-spine00", "ab", "current") == 2 * 5e9 / cap
    assert load("leaf000-spine00", "ab", "planned") == 5e9 / cap
    assert load("leaf000-spine01", "ab", "current") == 0.0
    assert load("leaf000-spine01", "ab", "planned") == 5e9 / cap
    assert m[("c4_plan_max_link_load", (("state", "current"),))] == 2 * 5e9 / cap
    assert m[("c4_plan_max_link_load", (("state", "planned"),))] == 5e9 / cap
    assert m[("c4_plan_flows", (("state", "planned"),))] == 2
    p.apply(3.0)  # the proposal is spent: no series until the next one
    assert not any(k[0] == "c4_plan_link_load" for k in scrape(reg))

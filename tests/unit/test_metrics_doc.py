"""The aggregator's /metrics: every family it exports is in docs/api.md's table (the metrics
list), and the measuring-probe count of candidates nobody could be asked to measure is one of
them (it lived only in `Measuring.unasked`)."""
from __future__ import annotations

import re
import shutil
import threading
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.registry import CollectorRegistry

from c4.aggregator.config import AggregatorConfig
from c4.aggregator.diagnosis.probes import ROUND_S
from c4.aggregator.metrics import ClusterMetrics, FederationMetrics
from c4.aggregator.server import Server, build_core
from tests.promtool import check_metrics, parse
from tests.unit.test_diag_measure_wire import fabric, path_finding
from tests.unit.test_federation_hostile import Owner

API_DOC = (Path(__file__).resolve().parents[2] / "docs" / "api.md").read_text()


def families(text: str) -> set[str]:
    return set(re.findall(r"^# TYPE (\S+)", text, re.M))


def test_every_exported_metric_is_in_the_api_doc(server: Server, tmp_path: Path) -> None:
    scrape = generate_latest(server.api.metrics).decode()
    owner = Owner(tmp_path)
    try:
        registry = CollectorRegistry()
        registry.register(FederationMetrics(owner.fed))
        scrape_fed = generate_latest(registry).decode()
    finally:
        owner.close()
    names = families(scrape) | families(scrape_fed)
    assert "c4_diagnosis_probe_unasked_total" in names and "c4_federation_lost_total" in names
    missing = sorted(n for n in names if f"`{n}`" not in API_DOC)
    assert not missing, f"docs/api.md (## /metrics) does not list {missing}"


def test_unasked_measuring_rounds_are_exported() -> None:
    core = build_core(AggregatorConfig(), db_path=":memory:", topology=fabric(4))
    diag = core.diagnosis
    diag.use_routes({"node000", "node001"}.__contains__)  # nobody routed under leaf01
    for t in range(100, 120):
        diag.tick(float(t))
        diag.measuring.resolve(path_finding("node000/mlx5_0->node002/mlx5_0"), float(t))
    registry = CollectorRegistry()
    registry.register(ClusterMetrics(threading.Lock(), lambda: [], core.store.conn, diag,
                                     lambda: 120.0))
    scrape = generate_latest(registry).decode()
    assert parse(scrape)["c4_diagnosis_probe_unasked_total"] == 20 // ROUND_S
    if shutil.which("promtool"):
        check_metrics(scrape)

"""Both exporters as real processes: the agent's per-host /metrics (node_exporter's names) and
the aggregator's cluster view, lint-clean under promtool; a dead host reads as down, never as
a healthy host with frozen counters."""
from __future__ import annotations

import shutil
import urllib.request
from pathlib import Path

import pytest

from tests.promtool import check_metrics, parse

from .procs import Cluster, wait_for

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "sysfs" / "mlx5_2port"
HOST = "gpu-exp-01"


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    dst = tmp_path / "sys"
    shutil.copytree(FIXTURE, dst, symlinks=True)
    return dst


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def test_agent_and_aggregator_metrics(cluster: Cluster, sysfs: Path) -> None:
    cluster.start_aggregator("silent_after = 2.0\nmetrics_host_counters = true\n")
    agent = cluster.start_agent(HOST, sysfs, interval=0.3)
    agent_url = f"http://127.0.0.1:{cluster.metrics_ports[HOST]}/metrics"

    cnp = next(sysfs.glob("class/infiniband/*/ports/1/hw_counters/np_cnp_sent"))
    dev = cnp.parents[3].name
    where = f'device="{dev}",port="1"'

    def agent_ready() -> dict[str, float]:
        m = parse(scrape(agent_url))
        return m if f"node_infiniband_np_cnp_packets_sent_total{{{where}}}" in m else {}

    m = wait_for(agent_ready, what="the agent's infiniband metrics")
    assert m[f"node_infiniband_np_cnp_packets_sent_total{{{where}}}"] == int(cnp.read_text())
    assert m['c4_agent_collector_success{collector="rdma"}'] == 1
    assert m[f"node_infiniband_state_id{{{where}}}"] in (1, 4)
    check_metrics(scrape(agent_url))

    def host_up() -> dict[str, float]:
        m = parse(scrape(cluster.url + "/metrics"))
        return m if m.get(f'c4_host_up{{host="{HOST}"}}') == 1 else {}

    m = wait_for(host_up, what="c4_host_up 1")
    key = f'device="{dev}",host="{HOST}",port="1"'
    assert f"node_infiniband_np_cnp_packets_sent_total{{{key}}}" in m  # behind the flag
    assert m['c4_incidents{class="comm_slow",state="open"}'] == 0  # every series from the start
    assert m['c4_actions_total{action="drain",result="failed"}'] == 0
    assert m[f'c4_host_last_report_age_seconds{{host="{HOST}"}}'] < 5
    check_metrics(scrape(cluster.url + "/metrics"))

    agent.stop()

    def host_down() -> dict[str, float]:
        m = parse(scrape(cluster.url + "/metrics"))
        return m if m.get(f'c4_host_up{{host="{HOST}"}}') == 0 else {}

    m = wait_for(host_down, what="c4_host_up 0")
    # the dead host's last counters are gone, not frozen
    assert not [k for k in m if k.startswith("node_infiniband_") and HOST in k]
    assert m[f'c4_host_last_report_age_seconds{{host="{HOST}"}}'] >= 2


def test_aggregator_exports_no_host_counters_by_default(cluster: Cluster, sysfs: Path) -> None:
    cluster.start_aggregator()
    cluster.start_agent(HOST, sysfs, interval=0.3)
    m = wait_for(lambda: (p := parse(scrape(cluster.url + "/metrics")))
                 .get(f'c4_host_up{{host="{HOST}"}}') == 1 and p, what="c4_host_up 1")
    assert not [k for k in m if k.startswith(("node_infiniband_", "c4_rdma_port_"))]

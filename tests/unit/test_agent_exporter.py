"""The agent's /metrics: node_exporter's infiniband families from a real mlx5 sysfs layout,
collector health, delivery and plugin counters, served over HTTP and clean under promtool."""
from __future__ import annotations

import shutil
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from c4.agent.collectors.base import Context
from c4.agent.collectors.rdma import RdmaCollector
from c4.agent.exporter import AgentMetrics, Exporter, Snapshot
from c4.core import catalog
from tests.promtool import check_metrics, parse

PORT1 = "tests/fixtures/sysfs/mlx5_2dev/class/infiniband/mlx5_0/ports/1"


def render(metrics: AgentMetrics) -> str:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(metrics)
    return generate_latest(reg).decode()


@pytest.fixture
def snapshot(fixtures: Path, tmp_path: Path) -> Snapshot:
    root = tmp_path / "sys"
    shutil.copytree(fixtures / "sysfs" / "mlx5_2dev", root, symlinks=True)
    rdma = RdmaCollector(Context(host="h", sysfs_root=root), {})
    section = rdma.collect(100.0).section
    return Snapshot(sections={"rdma": section, "nccl": {"comms": [], "malformed": 3,
                                                         "plugin_unsent": 7}},
                    health={"rdma": {"ok": True}, "tcp_flows": {"ok": False, "reason": "no BCC"}},
                    durations={"rdma": 0.0021}, nics=rdma.inventory()["nics"])


def counters(fixtures: Path, kind: str) -> dict[str, int]:
    d = fixtures.parent.parent / PORT1 / kind
    return {p.name: int(p.read_text()) for p in d.iterdir()}


def test_node_exporter_names_labels_and_units(snapshot: Snapshot, fixtures: Path) -> None:
    text = render(AgentMetrics(lambda: snapshot, lambda: {}, bpf=False))
    m = parse(text)
    where = 'device="mlx5_0",port="1"'
    hw = counters(fixtures, "hw_counters")
    ib = counters(fixtures, "counters")
    # hw_counters under node_exporter v1.11+'s names
    assert m[f"node_infiniband_np_cnp_packets_sent_total{{{where}}}"] == hw["np_cnp_sent"]
    assert m[f"node_infiniband_np_ecn_marked_roce_packets_received_total{{{where}}}"] == \
        hw["np_ecn_marked_roce_packets"]
    assert m[f"node_infiniband_out_of_sequence_packets_received_total{{{where}}}"] == \
        hw["out_of_sequence"]
    # the 4-octet data counters in bytes, as procfs converts them
    assert m[f"node_infiniband_port_data_transmitted_bytes_total{{{where}}}"] == \
        ib["port_xmit_data"] * 4
    # state, physical state and rate as numbers
    assert m[f"node_infiniband_state_id{{{where}}}"] == 4  # "4: ACTIVE"
    assert m[f"node_infiniband_physical_state_id{{{where}}}"] == 5  # "5: LinkUp"
    assert m[f"node_infiniband_rate_bytes_per_second{{{where}}}"] == 400 * 125_000_000
    info = [k for k in m if k.startswith("node_infiniband_info{")]
    assert len(info) == 2 and all('board_id="' in k and 'firmware_version="' in k for k in info)
    # every mlx5 hw_counter the fixture has is named, none falls into the catch-all family
    assert not [k for k in m if k.startswith(catalog.OTHER_COUNTER_METRIC)]
    assert set(hw) - {"lifespan"} <= set(catalog.NODE_EXPORTER_METRICS)  # lifespan: not a counter
    # collector health, the node_scrape_collector_* habit
    assert m['c4_agent_collector_success{collector="rdma"}'] == 1
    assert m['c4_agent_collector_success{collector="tcp_flows"}'] == 0
    assert m['c4_agent_collector_duration_seconds{collector="rdma"}'] == 0.0021
    assert m["c4_agent_plugin_datagrams_unsent_total"] == 7
    check_metrics(text)


def test_metrics_infiniband_false_leaves_them_to_node_exporter(snapshot: Snapshot) -> None:
    m = parse(render(AgentMetrics(lambda: snapshot, lambda: {}, infiniband=False, bpf=False)))
    assert not [k for k in m if k.startswith("node_infiniband_")]
    assert 'c4_agent_collector_success{collector="rdma"}' in m


def test_a_failed_collector_exports_no_stale_section(snapshot: Snapshot) -> None:
    failed = Snapshot(sections={}, health={"rdma": {"ok": False, "reason": "x"}},
                      nics=snapshot.nics)
    m = parse(render(AgentMetrics(lambda: failed, lambda: {}, bpf=False)))
    assert not [k for k in m if k.startswith("node_infiniband_port_")]
    assert m['c4_agent_collector_success{collector="rdma"}'] == 0


def test_served_over_http_with_delivery_counters(snapshot: Snapshot) -> None:
    sender = {"sent": 10, "resent": 2, "acked": 9, "unacked": 1, "dropped_queue_full": 4,
              "dropped_invalid": 0, "errors_received": 0, "reconnects": 1}
    ex = Exporter(AgentMetrics(lambda: snapshot, lambda: sender, bpf=True), "127.0.0.1:0")
    try:
        with urllib.request.urlopen(f"http://{ex.address}/metrics", timeout=5) as r:
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            text = r.read().decode()
    finally:
        ex.close()
    m = parse(text)
    assert m["c4_agent_frames_sent_total"] == 10 and m["c4_agent_frames_unacked"] == 1
    assert m['c4_agent_frames_dropped_total{reason="queue_full"}'] == 4
    assert m["c4_agent_bpf_stats_enabled"] == 0  # no BPF programs in this process
    check_metrics(text)

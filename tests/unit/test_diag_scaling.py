"""Diagnosis inputs whose cost per report no longer grows with the cluster (issue 15): they
still keep exactly what they kept before."""
from __future__ import annotations

from c4.aggregator.diagnosis.config import DiagnosisConfig
from c4.aggregator.diagnosis.counters import Counters
from c4.aggregator.diagnosis.model import Model
from c4.aggregator.diagnosis.tcp import TcpDetector


def _flow(sport: int, job: str, closed: bool = False) -> dict:
    return {"saddr": "10.0.0.1", "sport": sport, "daddr": "10.0.0.2", "dport": 29500,
            "pid": sport, "job": job, "closed": closed, "bytes_acked": 0, "retrans_segs": 0,
            "srtt_us": 40, "bytes_acked_delta": 0, "bytes_received_delta": 0,
            "retrans_segs_delta": 0}


def test_tcp_flow_counts_follow_the_agents_changed_only_listing() -> None:
    """Agents list only the flows that changed: an idle flow keeps counting for its job and
    host (GET /jobs, the jobs an event on that host hits) until it closes or a full refresh
    leaves it out. Before, a report that did not list a job's flows dropped the job there."""
    m = Model(None)
    tcp = TcpDetector(DiagnosisConfig(), m)
    tcp.on_report("h1", {"flows": [_flow(1, "a"), _flow(2, "a"), _flow(3, "b")]}, 1.0, 1.0)
    tcp.on_report("h2", {"flows": [_flow(1, "a")]}, 1.0, 1.0)
    assert m.flows == {"a": {"h1": 2, "h2": 1}, "b": {"h1": 1}}
    tcp.on_report("h1", {"flows": []}, 1.0, 2.0)  # nothing changed: nothing ended
    assert m.flows == {"a": {"h1": 2, "h2": 1}, "b": {"h1": 1}}
    assert m.jobs_on_host("h1") == ["a", "b"]
    tcp.on_report("h1", {"flows": [_flow(2, "a", closed=True), _flow(4, "c")]}, 1.0, 3.0)
    assert m.flows == {"a": {"h1": 1, "h2": 1}, "b": {"h1": 1}, "c": {"h1": 1}}
    tcp.on_report("h1", {"flows": [_flow(4, "c")], "refresh": True, "omitted": 0}, 1.0, 4.0)
    assert m.flows == {"a": {"h2": 1}, "c": {"h1": 1}}


def test_nic_counters_keep_only_the_roce_signals() -> None:
    c = Counters(DiagnosisConfig())
    port = {"dev": "mlx5_0", "rates": {"np_cnp_sent": 5, "port_xmit_data": 1e9,
                                       "out_of_sequence": 2.5}}
    c.on_rdma("h1", {"ports": [port, {"dev": "mlx5_1", "deltas": {"out_of_sequence": 8,
                                                                     "rx_write_requests": 9}}]},
              2.0)
    assert c.rates == {"h1/mlx5_0": {"np_cnp_sent": 5.0, "out_of_sequence": 2.5},
                       "h1/mlx5_1": {"out_of_sequence": 4.0}}
    c.on_rdma("h1", {"ports": [{"dev": "mlx5_0", "deltas": {"np_cnp_sent": 4}}]}, 0.0)
    assert c.rates["h1/mlx5_0"] == {}

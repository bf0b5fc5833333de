"""Diagnosis inputs whose cost per report no longer grows with the cluster (issue 15): they
still keep exactly what they kept before."""
from __future__ import annotations

from c4.aggregator.diagnosis.config import DiagnosisConfig
from c4.aggregator.diagnosis.counters import Counters
from c4.aggregator.diagnosis.model import Model


def _flow(pid: int, job: str, retrans: int = 0) -> dict:
    return {"pid": pid, "job": job, "retrans_segs_delta": retrans}


def test_tcp_flow_counts_follow_a_host_across_jobs() -> None:
    m = Model(None)
    m.on_tcp_flows("h1", {"flows": [_flow(1, "a", 2), _flow(2, "a"), _flow(3, "b", 1)]})
    m.on_tcp_flows("h2", {"flows": [_flow(1, "a")]})
    assert m.flows == {"a": {"h1": [2, 2], "h2": [1, 0]}, "b": {"h1": [1, 1]}}
    m.on_tcp_flows("h1", {"flows": [_flow(4, "c")]})  # job a and b ended on h1
    assert m.flows == {"a": {"h2": [1, 0]}, "b": {}, "c": {"h1": [1, 0]}}
    m.on_tcp_flows("h1", {"flows": []})
    assert m.flows["c"] == {} and m.flows["a"] == {"h2": [1, 0]}


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

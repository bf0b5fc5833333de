"""Diagnosis forgets a host silent past `host_expire_s` (its NICs, counters, loss ends, flows),
unless an open incident or a live communicator still names it: before, per-host state was
never dropped, so invented host names (a compromised federation peer) grew it for good."""
from __future__ import annotations

import logging
import sqlite3
from typing import Any

from c4.aggregator.diagnosis import HOST_SWEEP_S, Diagnosis, DiagnosisConfig
from c4.core.wire import Frame, kinds

HORIZON = 600.0


def frame(kind: str, host: str, body: dict[str, Any]) -> Frame:
    return Frame(kind, host, "b00t", 1, 1.7e9, kinds.validate_body(kind, body))


def hello(host: str) -> Frame:
    return frame("hello", host, {
        "agent_version": "t", "interval": 1.0, "collectors": {},
        "nics": [{"dev": "mlx5_0", "ports": [{"port": 1, "state": "ACTIVE", "netdev": "eth0",
                                              "rail": 0}]}]})


def report(host: str, i: int) -> Frame:
    """RDMA counters (loss and congestion signals) and one TCP flow of a job."""
    port = {"dev": "mlx5_0", "port": 1, "state": "ACTIVE", "counters": {},
            "rates": {"out_of_sequence": 1.0, "np_cnp_sent": 1.0}}
    flow = {"saddr": f"10.1.{i // 250}.{i % 250 + 1}", "daddr": "10.9.0.1", "sport": 40000,
            "dport": 29500, "family": "ipv4", "netns": 1, "pid": 100, "comm": "python",
            "state": "ESTABLISHED", "bytes_acked": 10 << 20, "bytes_received": 10,
            "retrans_segs": 0, "bytes_acked_delta": 10 << 20, "bytes_received_delta": 10,
            "retrans_segs_delta": 0, "bytes_acked_rate": 1.0, "bytes_received_rate": 1.0,
            "srtt_us": 50, "cwnd": 10, "closed": False, "job": "j"}
    tcp = {"flows": [flow], "omitted": 0, "tracked": 1, "map_full": 0, "drops": {},
           "drops_delta": {}, "owners": [{"pid": 100, "state": "S", "job": "j"}]}
    return frame("report", host, {"interval": 1.0, "health": {}, "rdma": {"ports": [port]},
                                  "tcp_flows": tcp})


def held(d: Diagnosis, host: str) -> list[str]:
    """Where diagnosis still keeps state of `host`."""
    places = {
        "model.hosts": host in d.model.hosts, "model.reported": host in d.model.reported,
        "model.addrs": any(h == host for h, _ in d.model.addrs.values()),
        "counters": any(n.startswith(host + "/") for n in d.counters.rates),
        "loss": any(n.startswith(host + "/") for _, n in d.loss.ends),
        "hardware": any(k[0] == host for k in d.hardware.ports),
        "tcp.flows": host in d.tcp.flows, "tcp.host_jobs": host in d.tcp.host_jobs,
        "model.flows": any(host in hs for hs in d.model.flows.values()),
        "heard": host in d.heard}
    return [k for k, v in places.items() if v]


def test_silent_hosts_are_forgotten_and_the_ones_still_needed_kept() -> None:
    db = sqlite3.connect(":memory:")
    d = Diagnosis.from_config(db, DiagnosisConfig(host_expire_s=HORIZON), None, None,
                              logging.getLogger("t"))
    invented = [f"fake{i}" for i in range(200)]
    for i, h in enumerate(invented + ["live", "down"]):
        d.observe(hello(h), 10.0)
        d.observe(report(h, i), 10.0)
    assert held(d, "fake0") == ["model.hosts", "model.reported", "model.addrs", "counters",
                                "loss", "hardware", "tcp.flows", "tcp.host_jobs",
                                "model.flows", "heard"]
    # "down" goes silent: the host_silent incident stays open and needs it
    d.host_silent("down", 10.0, 20.0)
    t = 10.0
    while t < 10.0 + HORIZON + 2 * HOST_SWEEP_S:
        t += 5.0
        d.observe(report("live", 0), t)
        d.tick(t)
    assert all(held(d, h) == [] for h in invented), held(d, "fake0")
    assert d.hosts_expired == len(invented)
    assert "counters" in held(d, "live") and "heard" in held(d, "live")
    assert any(i["suspects"][0]["host"] == "down" for i in d.incidents("open"))
    assert "model.hosts" in held(d, "down") and "heard" in held(d, "down")
    # a forgotten host that reports again starts over
    d.observe(report("fake0", 0), t + 1.0)
    assert "counters" in held(d, "fake0")
    db.close()


def test_nothing_is_forgotten_within_the_horizon() -> None:
    db = sqlite3.connect(":memory:")
    d = Diagnosis.from_config(db, DiagnosisConfig(host_expire_s=HORIZON), None, None,
                              logging.getLogger("t"))
    d.observe(hello("h0"), 10.0)
    d.observe(report("h0", 0), 10.0)
    before = held(d, "h0")
    for t in range(11, int(HORIZON), 7):
        d.tick(float(t))
    assert held(d, "h0") == before and d.hosts_expired == 0
    db.close()

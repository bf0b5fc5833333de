"""Diagnosis fed frame by frame (schema-valid bodies): hardware events mapped to devices and
jobs without a topology, ignored Xid codes, TCP flows attached to jobs, odd input counted."""
from __future__ import annotations

import logging
import sqlite3

import pytest

from c4.aggregator.diagnosis import Diagnosis, DiagnosisConfig
from c4.core.wire import Frame, kinds

COMM = "00000000000000c4"


def frame(kind, host, body, seq=1):
    return Frame(kind, host, "b00t", seq, 1.7e9, kinds.validate_body(kind, body))


def hello(host):
    return frame("hello", host, {
        "agent_version": "t", "interval": 1.0, "collectors": {},
        "nics": [{"dev": f"mlx5_{i}", "ports": [{"port": 1, "state": "ACTIVE",
                                                 "netdev": f"eth{i}", "rail": i}]}
                 for i in (1, 0)]})  # listed out of rail order on purpose


def report(host, rank, pid, extra=None):
    comm = {"comm": COMM, "rank": rank, "nranks": 2, "seq_started": 5, "seq_completed": 5,
            "colls": [], "peers": [], "pid": pid, "job": "slurm-77", "dev": rank}
    return frame("report", host, {"interval": 1.0, "health": {},
                                  "nccl": {"comms": [comm]}, **(extra or {})})


def event(host, type_, attrs):
    return frame("event", host, {"type": type_, "severity": "error", "attrs": attrs})


@pytest.fixture
def diag():
    db = sqlite3.connect(":memory:")
    d = Diagnosis.from_config(db, DiagnosisConfig(), None, None, logging.getLogger("t"))
    for i, host in enumerate(("h0", "h1")):
        d.observe(hello(host), 10.0)
        d.observe(report(host, i, 4000 + i), 10.0)
    yield d
    db.close()


def test_nic_link_down_names_the_rdma_device_of_the_netdev(diag):
    diag.observe(event("h1", "nic_link", {"pci": "0000:5e:00.0", "netdev": "eth0",
                                          "state": "down"}), 11.0)
    diag.tick(11.0)
    (inc,) = diag.incidents()
    assert inc["class"] == "hw_nic_down" and inc["job"] == "slurm-77"
    assert inc["suspects"][0]["id"] == "h1/mlx5_0" and inc["localised"] == 11.0
    diag.observe(event("h1", "nic_link", {"pci": "0000:5e:00.0", "netdev": "eth0",
                                          "state": "up"}), 12.0)
    for t in range(12, 80):
        diag.tick(float(t))
    assert diag.incident(inc["id"])["state"] == "resolved"


def test_xid_ties_to_the_rank_of_the_pid_and_ignored_codes_open_nothing(diag):
    diag.observe(event("h0", "xid", {"code": 13, "pci": "0000:3b:00", "pid": 4000,
                                     "process": "python", "text": "Graphics Exception"}), 11.0)
    diag.tick(11.0)
    assert diag.incidents() == []
    assert diag.hardware.ignored == {"xid_13": 1}
    diag.observe(event("h0", "xid", {"code": 48, "pci": "0000:3b:00", "pid": 4000,
                                     "process": "python", "text": "DBE"}), 12.0)
    diag.tick(12.0)
    (inc,) = diag.incidents()
    assert inc["suspects"][0] == {"kind": "gpu", "id": "h0/0000:3b:00", "host": "h0",
                                  "rank": 0, "confidence": 0.95}
    assert inc["comm"] == COMM and inc["job"] == "slurm-77"


def test_uncorrected_aer_without_a_topology_names_the_host(diag):
    diag.observe(event("h1", "pcie_aer", {"pci": "0000:5e:00.0", "severity": "corrected",
                                          "port": None, "text": "x"}), 11.0)
    diag.observe(event("h1", "pcie_aer", {"pci": "0000:5e:00.0", "severity": "fatal",
                                          "port": "0000:5d:00.0", "text": "x"}), 11.0)
    diag.tick(11.0)
    (inc,) = diag.incidents()
    assert inc["class"] == "hw_aer" and inc["suspects"][0]["kind"] == "host"
    assert inc["evidence"]["pci"] == "0000:5e:00.0"


def test_a_port_leaving_active_in_reports_is_a_nic_down(diag):
    port = {"dev": "mlx5_1", "port": 1, "state": "ACTIVE", "counters": {"link_downed": 0}}
    diag.observe(report("h0", 0, 4000, {"rdma": {"ports": [port]}}), 11.0)
    diag.observe(report("h0", 0, 4000, {"rdma": {"ports": [dict(port, state="DOWN")]}}), 12.0)
    diag.tick(12.0)
    (inc,) = diag.incidents()
    assert inc["class"] == "hw_nic_down" and inc["suspects"][0]["id"] == "h0/mlx5_1"


def test_tcp_flows_attach_to_the_job_of_their_process(diag):
    flow = {"saddr": "10.0.0.1", "daddr": "10.0.0.2", "sport": 40000, "dport": 29500,
            "family": "ipv4", "netns": 1, "pid": 4001, "comm": "python", "state": "ESTABLISHED",
            "bytes_acked": 10, "bytes_received": 10, "retrans_segs": 0,
            "bytes_acked_delta": 10, "bytes_received_delta": 10, "retrans_segs_delta": 0,
            "bytes_acked_rate": 1.0, "bytes_received_rate": 1.0, "srtt_us": 50, "cwnd": 10,
            "closed": False}
    other = dict(flow, pid=9999, sport=40001)  # another process's socket, no job
    tcp = {"flows": [flow, other], "omitted": 0, "tracked": 2, "map_full": 0, "drops": {},
           "drops_delta": {}}
    diag.observe(report("h1", 1, 4001, {"tcp_flows": tcp}), 11.0)
    (job,) = diag.jobs()
    assert job["job"] == "slurm-77" and job["flows"] == 1 and job["hosts"] == ["h0", "h1"]


def test_a_stall_event_for_an_unknown_communicator_is_ignored(diag):
    diag.observe(event("h0", "nccl_stall", {
        "comm": "ffffffffffffffff", "rank": 0, "nranks": 2, "seq": 1, "func": "AllReduce",
        "age_s": 9.0, "waiting": []}), 11.0)
    diag.tick(11.0)
    assert diag.incidents() == [] and not diag.errors


def test_a_section_diagnosis_cannot_use_is_counted_and_the_rest_goes_on(diag):
    bad = Frame("report", "h0", "b00t", 9, 1.7e9, {"interval": 1.0, "health": {},
                                                   "nccl": {"comms": [{"rank": 0}]}})
    diag.observe(bad, 11.0)  # ingest validates; this is defence in depth
    assert diag.errors == {"report:KeyError": 1}
    diag.observe(event("h1", "nic_link", {"pci": "0000:5e:00.0", "netdev": "eth1",
                                          "state": "down"}), 12.0)
    diag.tick(12.0)
    assert diag.incidents()[0]["suspects"][0]["id"] == "h1/mlx5_1"


def test_uncorrected_aer_names_the_nic_from_the_agents_inventory(diag):
    """No topology file: the agent's hello carries each NIC's PCI address, so an AER on it
    names (and can drain) that NIC, not the whole host."""
    h = hello("h1")
    h.body["nics"][0]["pci"] = "0000:5e:00.0"  # mlx5_1
    diag.observe(h, 10.5)
    diag.observe(event("h1", "pcie_aer", {"pci": "0000:5e:00.0", "severity": "fatal",
                                          "port": "0000:5d:00.0", "text": "x"}), 11.0)
    diag.tick(11.0)
    (inc,) = diag.incidents()
    assert inc["class"] == "hw_aer"
    assert (inc["suspects"][0]["kind"], inc["suspects"][0]["id"]) == ("nic", "h1/mlx5_1")


def test_one_rule_attributes_a_tcp_flow_to_a_job(diag):
    """A flow owned by a rank's process belongs to that rank's job, whatever job id the
    owner's environment gave; the job census and the TCP detector must agree (they used to
    follow two rules, so one flow could count in two jobs)."""
    base = {"saddr": "10.0.0.1", "daddr": "10.0.0.2", "sport": 40000, "dport": 29500,
            "family": "ipv4", "netns": 1, "comm": "python", "state": "ESTABLISHED",
            "bytes_acked": 10, "bytes_received": 10, "retrans_segs": 0,
            "bytes_acked_delta": 10, "bytes_received_delta": 10, "retrans_segs_delta": 0,
            "bytes_acked_rate": 1.0, "bytes_received_rate": 1.0, "srtt_us": 50, "cwnd": 10,
            "closed": False}
    owned = dict(base, pid=4001, job="env-job-of-a-wrapper")
    tcp = {"flows": [owned], "omitted": 0, "tracked": 1, "map_full": 0, "drops": {}, "drops_delta": {}}
    diag.observe(report("h1", 1, 4001, {"tcp_flows": tcp}), 11.0)
    assert [j["job"] for j in diag.jobs()] == ["slurm-77"]
    assert {f.job for f in diag.tcp.flows["h1"].values()} == {"slurm-77"}


def test_communicators_expire_on_the_aggregators_clock_and_are_bounded():
    """A sender claiming a one-hour interval used to keep its communicators for ten hours,
    and made-up communicators were never bounded (issue 10)."""
    db = sqlite3.connect(":memory:")
    d = Diagnosis.from_config(db, DiagnosisConfig(max_comms=3, comm_expire_max_s=60.0), None,
                              None, logging.getLogger("t"))
    for i in range(5):
        comm = {"comm": f"{i:016x}", "rank": 0, "nranks": 2, "seq_started": 1,
                "seq_completed": 1, "colls": [], "peers": [], "pid": 100 + i, "job": "j"}
        d.observe(frame("report", "h0", {"interval": 3600.0, "health": {},
                                         "nccl": {"comms": [comm]}}), 10.0 + i)
    assert len(d.model.comms) == 3
    d.tick(15.0)
    assert len(d.model.comms) == 3 and d.model.evicted == []
    d.tick(200.0)  # 3600 s x 10 intervals claimed; 60 s on our clock wins
    assert d.model.comms == {}

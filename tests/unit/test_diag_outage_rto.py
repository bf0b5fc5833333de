"""C4D's outage detector on a TCP job without any NIC counter of its timeouts. A real mlx5 NIC
counts ACK timeouts of its RoCE QPs only (`local_ack_timeout_err`); the lab's emulated NIC
copies the namespace's TcpExt TCPTimeouts into that counter, which no real NIC does for TCP.
The agents' eBPF tcp_flows report each connection's own retransmission timeouts (`rto`,
tcp:tcp_cong_state_set entering Loss): replayed with the copied counter removed, lab faults
recorded with them are named as with it; without `rto` too, nothing times out and they are
not (what a TCP job on real NICs got before)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from c4.core import record, wire
from tests.unit.test_diag_outage import named_after, rewrite, run, unpack

COUNTER = "local_ack_timeout_err"


def no_nic_timeouts(f: wire.Frame) -> None:
    for port in (f.body.get("rdma") or {}).get("ports", []):
        for key in ("counters", "deltas", "rates"):
            (port.get(key) or {}).pop(COUNTER, None)


def no_rto(f: wire.Frame) -> None:
    for flow in (f.body.get("tcp_flows") or {}).get("flows", []):
        flow.pop("rto", None)
        flow.pop("rto_delta", None)


def timeouts(rec: Path) -> tuple[int, int]:
    """(reports with a NIC's ACK timeouts, flow reports with an RTO) in the recording."""
    nic = rto = 0
    for data in record.read(rec):
        f = wire.decode(data)
        if f.kind != "report":
            continue
        nic += any((p.get("deltas") or {}).get(COUNTER) for p in
                   (f.body.get("rdma") or {}).get("ports", []))
        rto += sum(1 for x in (f.body.get("tcp_flows") or {}).get("flows", [])
                   if x.get("rto_delta"))
    return nic, rto


# lab run I (bench/lab --kinds down,flap --record, 2026-12-01, agents with `rto`)
CASES = [("13-down-leaf00-spine00-rto", "leaf00-spine00", 10.0),
         ("14-flap-leaf01-spine01-rto", "leaf01-spine01", 30.0)]


@pytest.mark.parametrize("name,link,within_s", CASES)
def test_a_tcp_jobs_own_timeouts_name_the_link_without_nic_counters(
        tmp_path: Path, name: str, link: str, within_s: float) -> None:
    rec, truth = unpack(name, tmp_path)
    nic, rto = timeouts(rec)
    assert nic and rto  # the recording has both: the lab's copy and the kernel's own
    rewrite(rec, no_nic_timeouts)
    assert timeouts(rec) == (0, rto)
    got = named_after(run(rec, truth), truth)
    assert list(got) == [link] and got[link] <= within_s, got


@pytest.mark.parametrize("name,link,within_s", CASES)
def test_without_either_timeout_the_same_fault_is_not_named_in_time(
        tmp_path: Path, name: str, link: str, within_s: float) -> None:
    rec, truth = unpack(name, tmp_path)

    def neither(f: Any) -> None:
        no_nic_timeouts(f)
        no_rto(f)

    rewrite(rec, neither)
    got = named_after(run(rec, truth), truth)
    assert got.get(link, float("inf")) > within_s, got

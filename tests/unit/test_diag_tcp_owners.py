"""TCP flows resolved once per owner and address in a report (tcp.py, model.py): what one
report resolved must not outlive it. A pid whose rank's process exited, taken by another
process, belongs to the new owner's job in the next report; a socket whose owner changed
moves to the new owner's sockets."""
from __future__ import annotations

from typing import Any

from c4.aggregator.diagnosis.config import DiagnosisConfig
from c4.aggregator.diagnosis.model import Model, bare_addr
from c4.aggregator.diagnosis.tcp import TcpDetector

H = "node000"


def flow(sport: int, pid: int | None, job: str | None = None, *, closed: bool = False,
         acked: int = 1 << 20) -> dict[str, Any]:
    f: dict[str, Any] = {
        "saddr": "::ffff:10.0.0.1", "sport": sport, "daddr": "10.0.0.2", "dport": 29500,
        "pid": pid, "bytes_acked": 10 * acked, "retrans_segs": 0, "srtt_us": 100,
        "bytes_acked_delta": acked, "bytes_received_delta": acked, "retrans_segs_delta": 0,
        "closed": closed}
    if job is not None:
        f["job"] = job
    return f


def rank(model: Model, pid: int, now: float) -> None:
    """Rank 0 of job "plug" on H, run by process `pid` (a plugin report)."""
    model.on_comm(H, {"comm": "c1", "job": "plug", "nranks": 2, "rank": 0, "pid": pid,
                      "dev": 0, "colls": [], "peers": [], "seq_started": 0,
                      "seq_completed": 0}, 1.0, now)


def test_a_pid_taken_by_another_process_moves_its_flows_to_the_new_owners_job() -> None:
    model = Model(None)
    det = TcpDetector(DiagnosisConfig(), model)
    rank(model, 100, 0.5)
    # the rank's process owns both flows: the rank's job, whatever the environment says
    det.on_report(H, {"flows": [flow(1, 100, "env"), flow(2, 100, "env")]}, 1.0, 1.0)
    assert {f.job for f in det.flows[H].values()} == {"plug"}
    assert model.flows == {"plug": {H: 2}}
    # the rank restarts as process 200; pid 100 is now a process of job "env"
    rank(model, 200, 1.5)
    det.on_report(H, {"flows": [flow(1, 100, "env"), flow(2, 100, "env")]}, 1.0, 2.0)
    assert {f.job for f in det.flows[H].values()} == {"env"}
    assert model.flows == {"env": {H: 2}}
    assert det.host_jobs[H] == {"env": 2}
    # one report, one pid, two jobs from the environment (a pid reused within the interval)
    det.on_report(H, {"flows": [flow(1, 300, "a"), flow(2, 300, "b")]}, 1.0, 3.0)
    assert {k[1]: f.job for k, f in det.flows[H].items()} == {1: "a", 2: "b"}
    assert model.flows == {"a": {H: 1}, "b": {H: 1}}


def test_an_unchanged_flow_keeps_its_state_object_with_the_latest_counters() -> None:
    det = TcpDetector(DiagnosisConfig(), Model(None))
    det.on_report(H, {"flows": [flow(1, 100, "j", acked=1000)]}, 1.0, 1.0)
    [st] = det.flows[H].values()
    det.on_report(H, {"flows": [flow(1, 100, "j", acked=5000)]}, 1.0, 2.0)
    assert list(det.flows[H].values()) == [st]
    assert (st.bytes_acked, st.seen) == (50000, 2.0)
    assert det.host_jobs[H] == {"j": 1}


def test_a_socket_whose_owner_changed_moves_to_the_new_owners_sockets() -> None:
    model = Model(None)
    sock = (bare_addr("::ffff:10.0.0.1"), 1, "10.0.0.2", 29500)
    model.on_socks(H, {"flows": [flow(1, 100)]}, 1 << 10)
    assert model.socks[H] == {sock: (100, True)}
    assert model.pid_socks == {(H, 100): {sock}}
    model.on_socks(H, {"flows": [flow(1, 200, acked=0)]}, 1 << 10)
    assert model.socks[H] == {sock: (200, False)}  # bulk was the old owner's
    assert model.pid_socks == {(H, 200): {sock}}
    model.on_socks(H, {"flows": [flow(1, 200, acked=0)]}, 1 << 10)
    assert model.socks[H] == {sock: (200, False)}
    model.on_socks(H, {"flows": [flow(1, 200)]}, 1 << 10)
    model.on_socks(H, {"flows": [flow(1, 200, acked=0)]}, 1 << 10)
    assert model.socks[H] == {sock: (200, True)}  # a bulk sender stays one
    model.on_socks(H, {"flows": [flow(1, None)]}, 1 << 10)  # its owner unknown now
    assert model.socks[H] == {} and model.pid_socks == {}
    model.on_socks(H, {"flows": [flow(1, 200)]}, 1 << 10)
    model.on_socks(H, {"flows": [flow(1, 200, closed=True)]}, 1 << 10)
    assert model.socks[H] == {} and model.pid_socks == {}


def test_bare_addr_is_the_same_function_cached() -> None:
    assert bare_addr("::ffff:10.1.2.3") == "10.1.2.3"
    assert bare_addr("10.1.2.3/24") == "10.1.2.3"
    assert bare_addr("fe80::1/64") == "fe80::1"
    assert bare_addr("::ffff:10.1.2.3") == "10.1.2.3"  # twice: from the cache

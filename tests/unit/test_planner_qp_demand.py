"""A QP's demand: its share of its port's transmit rate, weighted by what its process sent to
the QP's destination host (NCCL's per-peer bytes in the plugin summaries of the `nccl`
section, as diagnosis keeps them, each peer rank on the host whose report listed it)."""
from __future__ import annotations

import os

from c4.aggregator.config import AggregatorConfig
from c4.aggregator.planner.service import Sinks
from c4.aggregator.server import build_core
from tests.unit.test_nccl_collector import NOW, collector, ctx, golden, send  # noqa: F401
from tests.unit.test_planner_service import frame, hello, topo_with_addresses

COMM = "c4a11ed000000001"
STATS = ("creates", "create_failed", "modifies", "modify_failed", "destroys",
         "destroy_failed", "map_full", "unreported", "read_failed", "netlink_errors",
         "netlink_rejected")


def gid(i: int) -> str:
    return f"fe80:0000:0000:0000:0000:0000:0000:{i:04x}"


def comm(rank: int, pid: int, sends: dict[int, int], recvs: dict[int, int],
         job: str | None = "job-7") -> dict:
    """A ring rank's summary: bytes sent to / received from peer ranks on channel 0."""
    peers = [{"peer": r, "channel": 0, "dir": d, "bytes": b, "steps": b // 4096 or 1,
              "net_wait_s": 0.01}
             for d, by in (("send", sends), ("recv", recvs)) for r, b in by.items()]
    return {"comm": COMM, "rank": rank, "nranks": 4, "seq_started": 10, "seq_completed": 9,
            "colls": [{"func": "AllReduce", "count": 9, "bytes": 9 << 20, "time_s": 0.1}],
            "peers": peers, "pid": pid, "job": job}


def report(qps: list[tuple[int, int]], port_rate: float | None,
           comms: list[dict] | None, pid: int = 7) -> dict:
    """One process with RC QPs (lqpn, destination host index) on mlx5_0 port 1."""
    rows = [{"pid": pid, "comm": "python", "lqpn": n, "rqpn": n + 1000, "qp_type": "RC",
             "state": "RTS", "port": 1, "dgid": gid(h + 1), "flow_label": 0,
             "sport": 0xC000 + n, "destroyed": False} for n, h in qps]
    body: dict = {"interval": 1.0, "health": {}, "verbs_qp": {
        "qps": rows, "live": len(rows), "deferred": 0, "stats": dict.fromkeys(STATS, 0),
        "netlink": [{"dev": "mlx5_0", "port": 1, "lqpn": n, "rqpn": n + 1000,
                     "qp_type": "RC", "state": "RTS", "pid": pid, "comm": "python"}
                    for n, _ in qps]}}
    if port_rate is not None:
        body["rdma"] = {"ports": [{"dev": "mlx5_0", "port": 1, "state": "ACTIVE",
                                   "counters": {}, "rates": {"port_xmit_bytes": port_rate}}]}
    if comms is not None:
        body["nccl"] = {"comms": comms}
    return body


class Ring:
    """node000..node003 as the aggregator sees them: each frame to diagnosis, then to the
    planner (Sinks, as ingest hands them over); every host's NIC announces its GID."""

    def __init__(self) -> None:
        t = topo_with_addresses()
        self.core = build_core(AggregatorConfig(), db_path=":memory:", topology=t)
        self.p = self.core.planner
        self.sink = Sinks(self.core.diagnosis, self.p)
        for i, h in enumerate(sorted(t.hosts)):
            body = hello(h, f"10.0.0.{i + 1}")
            body["nics"][0]["ports"][0]["gids"] = [gid(i + 1)]
            self.observe("hello", h, body, 0.0)

    def observe(self, kind: str, host: str, body: dict, now: float) -> None:
        self.sink.observe(frame(kind, host, body), now)

    def ranks(self, now: float, *placed: tuple[int, str], comm_id: str = COMM,
              nranks: int = 4) -> None:
        for r, h in placed:
            c = dict(comm(r, 9, {}, {}), comm=comm_id, nranks=nranks)
            self.observe("report", h, {"interval": 1.0, "health": {},
                                       "nccl": {"comms": [c]}}, now)


def demands(p) -> dict[int, float]:
    return {f.meta["lqpn"]: f.demand for (h, _), f in p.live_flows().items()
            if h == "node000"}


def test_a_ring_ranks_port_rate_goes_to_its_qps_to_the_next_rank_not_the_previous():
    lab = Ring()
    lab.ranks(0.5, (1, "node001"), (3, "node003"))
    # rank 0 sends to rank 1 (node001) over QPs 100 and 101, receives from rank 3
    # (node003) over QP 102, which carries only its receive credits
    rep = report([(100, 1), (101, 1), (102, 3)], 9e9,
                 [comm(0, 7, sends={1: 8 << 30}, recvs={3: 8 << 30})])
    lab.observe("report", "node000", rep, 1.0)
    d = demands(lab.p)
    assert d[100] == d[101] == 4.5e9 and d[102] == 0.0  # an equal split gave each 3e9
    assert {f.job for f in lab.p.live_flows().values()} == {"job-7"}


def test_qps_split_the_port_equally_without_bytes_to_go_by():
    lab = Ring()
    qps = [(100, 1), (101, 1), (102, 3)]
    sends = [comm(0, 7, sends={1: 8 << 30}, recvs={3: 8 << 30})]
    # no plugin on the host
    lab.observe("report", "node000", report(qps, 9e9, None), 1.0)
    assert set(demands(lab.p).values()) == {3e9}
    # a peer rank no report has placed yet (node001's report not in): its bytes go nowhere
    lab.observe("report", "node000", report(qps, 9e9, sends), 2.0)
    assert set(demands(lab.p).values()) == {3e9}
    # the process sent nothing this interval
    lab.ranks(2.5, (1, "node001"))
    lab.observe("report", "node000", report(qps, 9e9, [
        comm(0, 7, sends={}, recvs={3: 8 << 30})]), 3.0)
    assert set(demands(lab.p).values()) == {3e9}
    # the port sent 3x what the process accounts for: PXN's proxy of another process sends
    # over these QPs, and that process's plugin counts none of it
    lab.observe("report", "node000", report(qps, 9e9, [
        comm(0, 7, sends={1: 3 << 30}, recvs={3: 3 << 30})]), 4.0)
    assert set(demands(lab.p).values()) == {3e9}
    # unmeasured port: 1 per QP, as before
    lab.observe("report", "node000", report(qps, None, sends), 5.0)
    assert set(demands(lab.p).values()) == {1.0}


def test_the_plugins_captured_summary_weights_the_qps_of_its_process(
        collector, send, golden):  # noqa: F811 (the fixtures imported above)
    # tests/fixtures/plugin/summary.bin, from the real plugin: rank 3 of 8 in a ring sends to
    # rank 4 and receives from rank 2; the agent's collector turns it into the report's
    # `nccl` section (pid from the socket's credentials: this process)
    send(golden["summary"])
    nccl = collector.collect(NOW).section
    (c,) = nccl["comms"]
    lab = Ring()
    lab.ranks(0.5, (4, "node001"), (2, "node003"), comm_id=c["comm"], nranks=8)
    sent = sum(p["bytes"] for p in c["peers"] if p["dir"] == "send")
    rep = report([(100, 1), (101, 3)], sent * 1.05, None, pid=os.getpid())  # + headers
    rep["nccl"] = nccl
    lab.observe("report", "node000", rep, 1.0)
    assert demands(lab.p) == {100: sent * 1.05, 101: 0.0}

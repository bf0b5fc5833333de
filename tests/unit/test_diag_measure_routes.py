"""Measuring probes under federation: each aggregator has its own agents, so a leg is asked
only of a host this aggregator's server routes (one that connected to it), from another host
under the same leaf when the path's own end reports elsewhere; a candidate no routed host can
measure is counted, never sent (the server would drop it with a warning every round)."""
from __future__ import annotations

import time
from pathlib import Path

import zmq

from c4.aggregator.config import AggregatorConfig
from c4.aggregator.diagnosis.probes import ROUND_S
from c4.aggregator.server import Server, build_core
from c4.core import wire
from c4.core.wire import Frame
from tests.e2e.procs import free_port, wait_for
from tests.unit.test_diag_measure_wire import fabric, path_finding


def asked(routed: set[str], seconds: int = 20) -> tuple[dict[str, int], int]:
    """(host -> measuring requests it was sent, candidate rounds not asked)."""
    diag = build_core(AggregatorConfig(), db_path=":memory:", topology=fabric(4)).diagnosis
    diag.use_routes(routed.__contains__)
    out: dict[str, int] = {}
    for t in range(100, 100 + seconds):
        diag.tick(float(t))
        diag.measuring.resolve(path_finding("node000/mlx5_0->node002/mlx5_0"), float(t))
        for host, _, _ in diag.take_outbox():
            out[host] = out.get(host, 0) + 1
    return out, diag.measuring.unasked


def test_a_leg_goes_from_another_routed_host_under_the_same_leaf():
    # node002 (the path's end under leaf01) reports to another aggregator: node003 measures
    got, unasked = asked({"node000", "node001", "node003"})
    assert set(got) == {"node000", "node003"}
    assert unasked == 0


def test_a_leaf_without_a_routed_host_is_counted_not_sent():
    got, unasked = asked({"node000", "node001"}, seconds=20)
    assert got == {}  # one leg separates nothing: nothing is asked
    assert unasked == 20 // ROUND_S  # once a round, not every tick


def test_the_server_routes_only_hosts_connected_to_it(tmp_path: Path):
    topo = tmp_path / "topo.json"
    fabric(4).save(topo)
    cfg = AggregatorConfig(listen=f"tcp://127.0.0.1:{free_port()}", api="127.0.0.1:0",
                           db=tmp_path / "c4.db", insecure=True, topology=str(topo))
    srv = Server(cfg)  # its loop is not running: _drain is called by hand
    agents = []
    try:
        def connect(host: str) -> None:
            agent = zmq.Context.instance().socket(zmq.DEALER)
            agent.setsockopt(zmq.LINGER, 0)
            agent.connect(cfg.listen)
            agents.append(agent)
            agent.send(wire.encode(Frame("report", host, "b1", 1, 1.0,
                                         {"interval": 1.0, "health": {}})))
            wait_for(lambda: srv._drain() or host in srv.routes, 10, f"{host} routed")

        def hosts(now: float) -> set[str]:
            diag = srv.core.diagnosis
            with srv.lock:
                diag.tick(now)
                diag.measuring.resolve(path_finding("node000/mlx5_0->node002/mlx5_0"), now)
                return {h for h, _ in srv._planner_frames(now)}

        connect("node000")
        now = time.time()
        assert hosts(now) == set()  # nobody under leaf01 is connected here
        connect("node003")
        assert hosts(now + ROUND_S) == {"node000", "node003"}
    finally:
        for a in agents:
            a.close(0)
        srv.stop_event.set()
        srv.close()

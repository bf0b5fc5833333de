"""A real agent answers the aggregator's `probe` and `plan` frames: a ZeroMQ ROUTER plays the
aggregator, the agent runs its own loop, and the answers must be schema-valid frames that say
what happened (a traced loopback path; a plan for a process without the library fails with
the reason)."""
from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import zmq

from c4.agent.config import AgentConfig
from c4.agent.daemon import Agent
from c4.core import wire
from c4.core.wire import Frame


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_agent_answers_probe_and_plan(tmp_path: Path) -> None:
    port = _free_port()
    ctx = zmq.Context.instance()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    router.bind(f"tcp://127.0.0.1:{port}")
    cfg = AgentConfig(aggregator=f"tcp://127.0.0.1:{port}", host="h1", interval=0.2,
                      run_dir=tmp_path / "run", collectors={"enabled": []})
    if hasattr(cfg, "insecure"):  # CURVE is on by default once identity (issue 10) is in
        cfg.insecure = True
    agent = Agent(cfg)
    t = threading.Thread(target=agent.run, daemon=True)
    t.start()
    try:
        ident = None
        deadline = time.monotonic() + 10
        while ident is None:
            assert time.monotonic() < deadline and router.poll(1000)
            ident, data = router.recv_multipart()
            if wire.decode(data).kind != "hello":
                ident = None
        seq = 0

        def send(kind: str, body: dict) -> None:
            nonlocal seq
            seq += 1
            router.send_multipart([ident, wire.encode(Frame(kind, "agg", "b0", seq, time.time(),
                                                            body))])

        send("probe", {"probe_id": "pr1", "probes": [
            {"id": "lo", "proto": "roce", "dst": "127.0.0.1", "sports": [50123, 50124]}]})
        send("plan", {"plan_id": "pl1", "epoch": 3, "assignments": [
            {"id": "q1", "proto": "roce", "sport": 50000, "lqpn": 0x200, "pid": 999999}]})
        got: dict[str, dict] = {}
        while len(got) < 2:
            assert time.monotonic() < deadline + 10 and router.poll(1000)
            frame = wire.decode(router.recv_multipart()[1])  # decode validates the schema
            if frame.kind in ("probe_result", "plan_result"):
                got[frame.kind] = frame.body
    finally:
        agent.stop_event.set()
        t.join(timeout=10)
        router.close()
    # loopback: no router on the way, the destination answers at TTL 1
    assert got["probe_result"] == {"probe_id": "pr1", "results": [
        {"id": "lo", "sport": 50123, "hops": [], "reached": True},
        {"id": "lo", "sport": 50124, "hops": [], "reached": True}]}
    plan = got["plan_result"]
    assert plan["plan_id"] == "pl1" and plan["applied"] == []
    assert "no path-control library connected for pid 999999" in plan["failed"][0]["reason"]
    assert not (tmp_path / "run" / "pathctl.sock").exists()  # removed at stop

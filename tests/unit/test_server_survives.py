"""The aggregator's ingest loop and tick outlive any failure inside them (issue 10).

A real Server on loopback with a real agent socket; the faults are injected into diagnosis
(the code a frame reaches after it is stored) because every frame-shaped path to a crash is
closed by the schema: what must hold is the guard, whatever the next bug is.
"""
from __future__ import annotations

import json
import urllib.request
from typing import Any

import msgpack
import zmq

from c4.aggregator.server import Server
from c4.core import wire
from c4.core.wire import Frame
from tests.e2e.procs import wait_for


def _api(srv: Server, path: str) -> tuple[int, Any]:
    host, port = srv.httpd.server_address[:2]
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _agent(srv: Server) -> zmq.Socket:
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(srv.cfg.listen)
    return s


def _report(seq: int) -> bytes:
    return wire.encode(Frame("report", "h1", "b1", seq, 1.0, {"interval": 1.0, "health": {}}))


def _acked(sock: zmq.Socket, want: int) -> bool:
    while sock.poll(50):
        f = wire.decode(sock.recv())
        if f.kind == "ack" and f.body["seq"] >= want:
            return True
    return False


def test_a_failing_diagnosis_costs_a_counter_not_the_process(server: Server) -> None:
    def broken_observe(frame: Frame, now: float) -> None:
        raise RuntimeError("a bug in diagnosis")

    def broken_tick(now: float) -> None:
        raise ZeroDivisionError("a bug in a detector")

    server.core.diagnosis.observe = broken_observe  # type: ignore[method-assign]
    server.core.diagnosis.tick = broken_tick  # type: ignore[method-assign]
    sock = _agent(server)
    try:
        for seq in (1, 2, 3):
            sock.send(_report(seq))
        # Stored before diagnosis saw them: still acked.
        wait_for(lambda: _acked(sock, 3), 10, "ack of 3 frames")
        wait_for(lambda: server.core.ingest.errors["tick"] >= 2, 10, "two failed ticks")
        assert server.core.ingest.errors["apply"] == 3
        code, health = _api(server, "/healthz")
        assert code == 200 and health["ok"]
        code, stats = _api(server, "/api/v1/stats")
        assert stats["errors"]["apply"] == 3
    finally:
        sock.close(0)


def test_hostile_frames_leave_the_loop_running(server: Server) -> None:
    sock = _agent(server)
    try:
        bad = [msgpack.packb({"v": [1], "kind": "report", "host": "h1", "boot": "b", "seq": 1,
                              "ts": 1.0, "body": {}}),
               msgpack.packb({"v": [1, 0], "kind": "report", "host": "h1", "boot": "b",
                              "seq": 2**64 - 1, "ts": 1.0, "body": {}}),
               msgpack.packb({"v": [1, 0], "kind": "report", "host": "h1", "boot": "b",
                              "seq": True, "ts": 1.0, "body": {}})]
        for data in bad:
            sock.send(data)
        sock.send(_report(1))
        wait_for(lambda: _acked(sock, 1), 10, "ack after the bad frames")
        assert server.core.ingest.rejected["bad_envelope"] == 3
        assert _api(server, "/healthz")[0] == 200
    finally:
        sock.close(0)


"""Bounds on what peers can make the aggregator hold or do (issue 10): hosts (a cap and expiry
on the aggregator's clock), work per hold of the global lock, HTTP connections, API paths."""
from __future__ import annotations

import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import zmq

from c4.aggregator import server as server_mod
from c4.aggregator.api import Api, serve
from c4.aggregator.config import AggregatorConfig
from c4.aggregator.ingest import Ingest
from c4.aggregator.server import Server
from c4.aggregator.state import HostRegistry
from c4.aggregator.store import Store, connect
from c4.core import wire
from c4.core.wire import Frame
from tests.e2e.procs import free_port, wait_for
from tests.unit.test_server_survives import _api


def _report(host: str, seq: int = 1) -> bytes:
    return wire.encode(Frame("report", host, "b1", seq, 1.0, {"interval": 1.0, "health": {}}))


def test_made_up_host_names_cannot_grow_the_registry(tmp_path: Path) -> None:
    ing = Ingest(Store(connect(tmp_path / "c4.db")), HostRegistry(), None, max_hosts=3,
                 silent_after=5.0, host_expiry_s=100.0)
    for i in range(3):
        assert ing.handle(_report(f"h{i}"), 10.0 + i).reject is None
    out = ing.handle(_report("intruder"), 13.0)
    assert out.reject == "host_limit" and ing.rejected["host_limit"] == 1
    assert set(ing.registry.hosts) == {"h0", "h1", "h2"}
    ing.handle(_report("h1", 2), 14.0)
    ing.handle(_report("h2", 2), 14.0)
    ing.tick(16.0)  # h0 silent since 10.0
    assert ing.handle(_report("h3"), 16.0).reject is None
    assert set(ing.registry.hosts) == {"h1", "h2", "h3"}  # h0 made room
    # Expiry on the aggregator's clock: silent longer than host_expiry_s, forgotten (also on
    # disk, so a restart does not bring it back).
    ing.tick(30.0)
    ing.prune(200.0)
    assert ing.registry.hosts == {}
    assert list(ing.store.hosts()) == []


def test_drain_holds_the_lock_for_a_bounded_batch(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server_mod, "DRAIN_FRAMES", 50)
    cfg = AggregatorConfig(listen=f"tcp://127.0.0.1:{free_port()}", api="127.0.0.1:0",
                           db=tmp_path / "c4.db", insecure=True)
    srv = Server(cfg)  # its loop is not running: _drain is called by hand
    agent = zmq.Context.instance().socket(zmq.DEALER)
    agent.setsockopt(zmq.LINGER, 0)
    agent.connect(cfg.listen)
    try:
        for seq in range(1, 201):
            agent.send(_report("h1", seq))
        wait_for(lambda: srv.sock.poll(100), 10, "frames at the ROUTER")
        time.sleep(0.3)  # all 200 through TCP
        srv._drain()
        assert sum(srv.core.ingest.accepted.values()) == 50
        def rest() -> bool:
            srv._drain()
            return sum(srv.core.ingest.accepted.values()) == 200
        wait_for(rest, 10, "the rest in later batches")
    finally:
        agent.close(0)
        srv.stop_event.set()
        srv.close()


def test_idle_http_connections_are_capped_and_timed_out() -> None:
    ing = Ingest(Store(connect(":memory:", check_same_thread=False)), HostRegistry(), None)
    httpd = serve(Api(ing, None, threading.Lock()), "127.0.0.1:0", max_connections=8,
                  timeout=0.5)
    host, port = httpd.server_address[:2]
    idle = [socket.create_connection((host, port)) for _ in range(40)]
    try:
        wait_for(lambda: httpd.refused >= 32, 10, "connections over the cap refused")
        threads = sum(1 for t in threading.enumerate() if t.name.startswith("Thread"))
        assert threads <= 8 + 2
        # The idle ones time out, and the API answers again.
        def ok() -> bool:
            with urllib.request.urlopen(f"http://{host}:{port}/healthz", timeout=2) as r:
                return r.status == 200
        wait_for(ok, 10, "the API after the idle connections timed out")
    finally:
        for s in idle:
            s.close()
        httpd.shutdown()
        httpd.server_close()


@pytest.mark.parametrize("iid", ["99999999999999999999999", "²", "1e3", "-1", "%00", "٣"])
def test_malformed_incident_ids_are_400(server, iid: str) -> None:  # noqa: F811
    code, body = _api(server, f"/api/v1/incidents/{urllib.request.quote(iid)}")
    assert code == 400 and "incident id" in body["error"]


def test_unknown_incident_and_host_are_404(server) -> None:  # noqa: F811
    assert _api(server, "/api/v1/incidents/123456789012345678")[0] == 404
    assert _api(server, "/api/v1/hosts/%FF%FE")[0] == 404

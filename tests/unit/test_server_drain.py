"""The server's drain (issue 15): frames are decoded without Server.lock, so the API and the
ticks are not held up by a large frame being decoded; they are still admitted in arrival order,
and acked only once stored. A real Server on loopback with real agent sockets."""
from __future__ import annotations

import json
import threading
import urllib.request

import zmq

from c4.aggregator.server import DRAIN_FRAMES, Server
from c4.core import wire
from c4.core.wire import Frame
from tests.e2e.procs import wait_for


def _agent(srv: Server) -> zmq.Socket:
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(srv.cfg.listen)
    return s


def _report(host: str, seq: int) -> bytes:
    return wire.encode(Frame("report", host, "b1", seq, float(seq), {
        "interval": 1.0, "health": {}, "host": {"cpu_pct": 1.0, "load1": float(seq),
                                                "mem_used_bytes": 1, "mem_total_bytes": 2,
                                                "uptime_s": 1.0}}))


def _acked(sock: zmq.Socket, want: int) -> int:
    """The highest seq acked so far, reading acks until `want` is covered or none comes."""
    top = 0
    while top < want and sock.poll(2000):
        f = wire.decode(sock.recv())
        if f.kind == "ack":
            top = max(top, f.body["seq"])
    return top


def test_api_answers_while_a_frame_is_being_decoded(server: Server) -> None:
    ingest = server.core.ingest
    decode, entered, release = ingest.decode, threading.Event(), threading.Event()

    def held_decode(data: bytes) -> Frame:  # the real decoder, held at its start by the test
        entered.set()
        release.wait(30)
        return decode(data)

    ingest.decode = held_decode  # type: ignore[method-assign]
    agent = _agent(server)
    try:
        agent.send(_report("h1", 1))
        assert entered.wait(10)
        # Decoding under the lock would block this request until the decoder is released,
        # which happens only after it answered: it would time out.
        host, port = server.httpd.server_address[:2]
        with urllib.request.urlopen(f"http://{host}:{port}/api/v1/stats", timeout=5) as r:
            stats = json.loads(r.read())
        assert stats["accepted"] == {}  # not admitted yet: nothing counted half-way
        assert server.lock.acquire(timeout=5)
        server.lock.release()
        release.set()
        assert _acked(agent, 1) == 1
        assert [seq for _, _, seq, _ in server.core.store.frames("h1")] == [1]
    finally:
        release.set()
        agent.close(0)


def test_frames_of_a_host_are_admitted_in_arrival_order_across_drains(server: Server) -> None:
    agents = {h: _agent(server) for h in ("h1", "h2")}
    n = DRAIN_FRAMES + DRAIN_FRAMES // 2  # more than one drain's worth per host
    try:
        for seq in range(1, n + 1):
            for host, sock in agents.items():
                sock.send(_report(host, seq))
        for sock in agents.values():
            assert _acked(sock, n) == n
        with server.lock:
            conn = server.core.store.conn
            for host in agents:
                order = [s for (s,) in conn.execute(
                    "SELECT seq FROM frames WHERE host=? ORDER BY rowid", (host,))]
                assert order == list(range(1, n + 1))
                h = server.core.registry.hosts[host]
                assert h.reports == n and h.last_report["host"]["load1"] == float(n)
                assert h.seqs["b1"].contiguous == n
    finally:
        for sock in agents.values():
            sock.close(0)


def test_a_frame_that_is_not_one_part_is_counted_malformed(server: Server) -> None:
    agent = _agent(server)
    try:
        agent.send_multipart([b"one", b"two"])
        agent.send(_report("h1", 1))
        assert _acked(agent, 1) == 1
        wait_for(lambda: server.core.ingest.rejected["malformed"] == 1, 10, "malformed counted")
    finally:
        agent.close(0)

"""Agent -> aggregator -> CLI, as real processes on loopback, reading a fixture mlx5 tree."""
from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
import time
from pathlib import Path

import msgpack
import pytest
import zmq

from c4.core import record, wire

from .procs import Cluster, wait_for

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "sysfs" / "mlx5_2port"
HOST = "gpu-e2e-01"


@pytest.fixture
def sysfs(tmp_path: Path) -> Path:
    dst = tmp_path / "sys"
    shutil.copytree(FIXTURE, dst, symlinks=True)
    return dst


def _counter_file(sysfs: Path, port: int, name: str) -> Path:
    hits = list(sysfs.glob(f"class/infiniband/*/ports/{port}/*counters/{name}"))
    assert len(hits) == 1, f"fixture has no single {name} for port {port}: {hits}"
    return hits[0]


def _bump(path: Path, by: int) -> int:
    value = int(path.read_text()) + by
    path.write_text(f"{value}\n")
    return value


def _port(host: dict, port: int) -> dict:
    ports = host["report"]["rdma"]["ports"]
    return next(p for p in ports if p["port"] == port)


def test_host_appears_with_counters_and_rates(cluster: Cluster, sysfs: Path) -> None:
    cluster.start_aggregator()
    cluster.start_agent(HOST, sysfs, interval=0.5)
    wait_for(lambda: cluster.api(f"/api/v1/hosts/{HOST}")["reports"] >= 2, what="two reports")

    cnp = _counter_file(sysfs, 1, "np_cnp_sent")
    before = int(cnp.read_text())
    _bump(cnp, 5000)

    def rate_seen() -> dict | None:
        p = _port(cluster.api(f"/api/v1/hosts/{HOST}"), 1)
        return p if p.get("deltas", {}).get("np_cnp_sent", 0) > 0 else None

    p = wait_for(rate_seen, what="a CNP delta")
    assert p["counters"]["np_cnp_sent"] == before + 5000
    assert p["deltas"]["np_cnp_sent"] == 5000
    # The rate is the delta over the measured sampling interval (~0.5 s here).
    assert 5000 / 2.0 < p["rates"]["np_cnp_sent"] < 5000 / 0.2

    out = cluster.cli("hosts", "--json")
    assert out.returncode == 0, out.stderr
    hosts = json.loads(out.stdout)["hosts"]
    assert [h["name"] for h in hosts] == [HOST]
    assert hosts[0]["status"] == "up" and hosts[0]["ports"] == 2

    out = cluster.cli("host", HOST, "--json")
    assert out.returncode == 0, out.stderr
    detail = json.loads(out.stdout)
    assert {p["port"] for p in detail["report"]["rdma"]["ports"]} == {1, 2}
    assert detail["hello"]["nics"][0]["dev"] == detail["report"]["rdma"]["ports"][0]["dev"]

    # The human views render too.
    assert HOST in cluster.cli("hosts").stdout
    human = cluster.cli("host", HOST).stdout
    assert "mlx5_0/1" in human and "CNP tx/s" in human
    assert "np_cnp_sent" in cluster.cli("host", HOST, "--counters").stdout
    sender = detail["report"]["sender"]  # the agent's delivery counters ride in each report
    assert sender["dropped_queue_full"] == 0 and sender["errors_received"] == 0
    # Prometheus sees the same counters on the agent's exporter, under node_exporter's names.
    import urllib.request

    agent_metrics = f"http://127.0.0.1:{cluster.metrics_ports[HOST]}/metrics"
    with urllib.request.urlopen(agent_metrics, timeout=5) as r:
        metrics = r.read().decode()
    samples = dict(line.rsplit(" ", 1) for line in metrics.splitlines()
                   if line and not line.startswith("#"))
    words = int(_counter_file(sysfs, 1, "port_xmit_data").read_text())  # 4-octet units
    key = 'device="mlx5_0",port="1"'
    assert float(samples[f"node_infiniband_port_data_transmitted_bytes_total{{{key}}}"]) == \
        words * 4
    assert float(samples[f"node_infiniband_np_cnp_packets_sent_total{{{key}}}"]) == before + 5000

    out = cluster.cli("host", "no-such-host")
    assert out.returncode != 0 and "no host named" in out.stderr


def test_aggregator_restart_loses_and_duplicates_nothing(cluster: Cluster, sysfs: Path,
                                                         tmp_path: Path) -> None:
    rec = tmp_path / "agent.c4rec"
    cluster.start_aggregator()
    agent = cluster.start_agent(HOST, sysfs, interval=0.2, record=rec)
    wait_for(lambda: cluster.api(f"/api/v1/hosts/{HOST}")["reports"] >= 3, what="reports")

    cluster.aggregator.stop(signal.SIGKILL)  # no chance to flush anything
    time.sleep(2.0)  # the agent keeps collecting into its queue meanwhile
    cluster.start_aggregator()

    def recorded() -> list[tuple[str, int]]:
        return [(f.boot, f.seq) for f in map(wire.decode, record.read(rec))]

    def caught_up() -> bool:
        last = recorded()[-1][1]
        return cluster.api(f"/api/v1/hosts/{HOST}")["seq"]["contiguous"] >= last

    wait_for(caught_up, timeout=30, what="the agent's resends to be stored")
    assert agent.stop() == 0
    cluster.aggregator.stop()

    sent = recorded()
    # While the aggregator was down the agent held its frames (its reports say how many)...
    held = max(f.body["sender"]["unacked"] for f in map(wire.decode, record.read(rec))
               if f.kind == "report")
    assert held >= 5
    rows = sqlite3.connect(cluster.db).execute(
        "SELECT boot, seq FROM frames WHERE host=? ORDER BY seq", (HOST,)).fetchall()
    stored = [(b, s) for b, s in rows]
    assert len(set(stored)) == len(stored)
    # plan_result frames are the only ones an agent may send that are not stored here; this
    # agent got no plan, so every recorded frame must be stored, exactly once.
    assert stored == sorted(sent, key=lambda t: t[1])
    assert [s for _, s in stored] == list(range(1, len(sent) + 1))


def _frame(kind: str, body: dict, *, seq: int = 1, version=(1, 0), **over) -> dict:
    f = {"v": list(version), "kind": kind, "host": "hostile-1", "boot": "b0", "seq": seq,
         "ts": time.time(), "body": body}
    f.update(over)
    return f


def test_bad_frames_are_rejected_with_reasons_while_serving(cluster: Cluster,
                                                            sysfs: Path) -> None:
    max_frame = 64 * 1024
    cluster.start_aggregator(extra=f"max_frame = {max_frame}\n")
    cluster.start_agent(HOST, sysfs, interval=0.3)
    wait_for(lambda: cluster.api(f"/api/v1/hosts/{HOST}")["reports"] >= 2, what="reports")

    ctx = zmq.Context()
    sock = cluster.dealer(ctx, "hostile-1")  # an enrolled key: the frames themselves are bad
    cases = {
        "malformed": os.urandom(512),
        "bad_body": msgpack.packb(_frame("ack", {"boot": "x", "seq": "three"})),
        "bad_envelope": msgpack.packb(_frame("report", {}, seq="1")),
        "too_large": msgpack.packb(_frame("event", {"type": "xid", "severity": "error",
                                                    "attrs": {}, "msg": "x" * (max_frame + 100)})),
        "unknown_kind": msgpack.packb(_frame("gossip", {})),
        "unsupported_version": msgpack.packb(_frame("report", {}, version=(9, 0))),
        "unexpected_kind": msgpack.packb(_frame("ack", {"boot": "x", "seq": 1})),
    }
    # A report whose field has the wrong type is bad_body too.
    wrong_type = msgpack.packb(_frame("report", {"interval": "1s", "health": {}}))
    try:
        for reason, data in [*cases.items(), ("bad_body", wrong_type)]:
            before = cluster.api("/api/v1/stats")["rejected"][reason]
            reports_before = cluster.api(f"/api/v1/hosts/{HOST}")["reports"]
            sock.send(data)
            assert sock.poll(5000), f"no error reply for {reason}"
            reply = wire.decode(sock.recv())
            assert reply.kind == "error" and reply.body["code"] == reason, reply.body
            if reason == "unsupported_version":
                assert reply.body["supported"] == [1]
                assert "9.0 is not supported" in reply.body["reason"]
            wait_for(lambda r=reason, n=before: cluster.api("/api/v1/stats")["rejected"][r] == n + 1,
                     what=f"{reason} counter")
            # ...and the well-behaved agent is still being served.
            wait_for(lambda n=reports_before: cluster.api(f"/api/v1/hosts/{HOST}")["reports"] > n,
                     what="the good agent's next report")
    finally:
        sock.close()
        ctx.term()
    assert "hostile-1" not in [h["name"] for h in cluster.api("/api/v1/hosts")["hosts"]]
    metrics = cluster.cli("hosts")  # the API still answers people
    assert metrics.returncode == 0
    assert "unsupported_version" in cluster.aggregator.output()


def test_replay_reproduces_host_state(cluster: Cluster, sysfs: Path, tmp_path: Path) -> None:
    rec = tmp_path / "live.c4rec"
    cluster.start_aggregator()
    agent = cluster.start_agent(HOST, sysfs, interval=0.2, record=rec)
    wait_for(lambda: cluster.api(f"/api/v1/hosts/{HOST}")["reports"] >= 3, what="reports")
    _bump(_counter_file(sysfs, 2, "port_rcv_data"), 123456)
    wait_for(lambda: _port(cluster.api(f"/api/v1/hosts/{HOST}"), 2)["deltas"].get(
        "port_rcv_data", 0) > 0, what="a port_rcv_data delta")
    assert agent.stop() == 0
    live = cluster.api(f"/api/v1/hosts/{HOST}")
    cluster.aggregator.stop()

    outs = [cluster.cli("replay", str(rec), "--json", api=False) for _ in range(2)]
    for o in outs:
        assert o.returncode == 0, o.stderr
    assert outs[0].stdout == outs[1].stdout  # deterministic
    result = json.loads(outs[0].stdout)
    (host,) = result["hosts"]
    volatile = {"last_seen", "last_seen_age_s"}
    live_summary = {k: v for k, v in live.items() if k in host and k not in volatile}
    assert {k: v for k, v in host.items() if k not in volatile} == live_summary
    assert result["stats"]["accepted"]["report"] == live["reports"]

    human = cluster.cli("replay", str(rec), api=False)
    assert human.returncode == 0 and HOST in human.stdout


def test_agent_repeats_hello(cluster, sysfs: Path, tmp_path: Path) -> None:
    """No aggregator at all: the agent still records what it sends, hello first and again
    every hello_interval, so a restarted aggregator without its database catches up."""
    rec = tmp_path / "hello.c4rec"
    agent = cluster.start_agent(HOST, sysfs, interval=0.2, record=rec,
                                extra="hello_interval = 0.6")
    wait_for(lambda: rec.exists() and sum(
        wire.decode(b).kind == "hello" for b in record.read(rec)) >= 3, what="three hellos")
    assert agent.stop() == 0
    kinds = [wire.decode(b).kind for b in record.read(rec)]
    assert kinds[0] == "hello" and kinds.count("report") >= kinds.count("hello")

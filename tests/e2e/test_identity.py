"""Only a host's enrolled CURVE key may speak for it: real aggregator and agent processes.

Each test plays the attacker of issue 10 ("Identity"): a forged host name from a key enrolled
for another host, a key that was never enrolled, a key revoked while connected, a client with
no CURVE at all; plus plain-TCP mode and the configuration errors an operator meets first.
"""
from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import msgpack
import zmq

from c4.core import keys, wire

from .procs import REPO, Cluster, c4_cmd, env, wait_for

HOST = "gpu-id-01"


def _hello(host: str, *, interval: float = 1.0, seq: int = 1, boot: str = "b0") -> bytes:
    return msgpack.packb({"v": [1, 0], "kind": "hello", "host": host, "boot": boot, "seq": seq,
                          "ts": time.time(), "body": {"agent_version": "x", "interval": interval,
                                                      "collectors": {}, "nics": []}})


def _reply(sock: zmq.Socket, timeout_ms: int = 5000) -> wire.Frame | None:
    return wire.decode(sock.recv()) if sock.poll(timeout_ms) else None


def _stats(cluster: Cluster) -> dict[str, Any]:
    return cluster.api("/api/v1/stats")


def _hosts(cluster: Cluster) -> list[str]:
    return [h["name"] for h in cluster.api("/api/v1/hosts")["hosts"]]


def test_forged_host_from_an_enrolled_key_is_rejected_and_counted(cluster: Cluster,
                                                                 tmp_path: Path) -> None:
    cluster.start_aggregator()
    cluster.start_agent(HOST, tmp_path, interval=0.3, collectors=("host",))
    wait_for(lambda: cluster.api(f"/api/v1/hosts/{HOST}")["reports"] >= 2, what="reports")
    ctx = zmq.Context()
    sock = cluster.dealer(ctx, "gpu-id-02")  # a real, enrolled key, but for another host
    try:
        # The attack of the issue: a hello hiding HOST for an hour.
        sock.send(_hello(HOST, interval=3600, boot="forged"))
        reply = _reply(sock)
        assert reply is not None and reply.kind == "error", reply
        assert reply.body["code"] == "identity" and "gpu-id-02" in reply.body["reason"]
        wait_for(lambda: _stats(cluster)["rejected"]["identity"] == 1, what="identity counter")
        assert cluster.api(f"/api/v1/hosts/{HOST}")["interval"] == 0.3
        # The same key speaking for its own host is fine: the check is the binding, not the key.
        sock.send(_hello("gpu-id-02"))
        reply = _reply(sock)
        assert reply is not None and reply.kind == "ack", reply
        assert "gpu-id-02" in _hosts(cluster)
    finally:
        ctx.destroy(0)
    assert 'c4_frames_rejected_total{reason="identity"} 1.0' in _metrics(cluster)


def _metrics(cluster: Cluster) -> str:
    import urllib.request

    with urllib.request.urlopen(cluster.url + "/metrics", timeout=5) as r:
        return r.read().decode()


def test_an_unenrolled_key_cannot_deliver_a_frame(cluster: Cluster) -> None:
    """The CURVE pitfall: without a ZAP handler any key is admitted. This one is valid CURVE
    but not enrolled; and a client without CURVE at all gets nowhere either."""
    cluster.start_aggregator()
    ctx = zmq.Context()
    intruder = cluster.dealer(ctx, "intruder", enroll=False)
    plain = cluster.dealer(ctx)  # no keys: a NULL-mechanism client
    try:
        intruder.send(_hello("intruder"))
        plain.send(_hello("plain"))
        assert _reply(intruder, 2000) is None and _reply(plain, 500) is None
        wait_for(lambda: _stats(cluster)["auth"]["denied"]["unenrolled"] >= 1,
                 what="the refused handshake counted")
    finally:
        ctx.destroy(0)
    st = _stats(cluster)
    assert st["accepted"] == {} and sum(st["rejected"].values()) == 0
    assert _hosts(cluster) == []
    assert "is not enrolled" in cluster.aggregator.output()
    assert 'c4_auth_denied_total{reason="unenrolled"}' in _metrics(cluster)


def test_a_revoked_key_is_refused_without_restarting(cluster: Cluster) -> None:
    cluster.start_aggregator()
    ctx = zmq.Context()
    sock = cluster.dealer(ctx, "gpu-rev")
    try:
        sock.send(_hello("gpu-rev", seq=1))
        reply = _reply(sock)
        assert reply is not None and reply.kind == "ack", reply
        out = cluster.cli("keys", "revoke", "--host", "gpu-rev", "--store", str(cluster.store),
                          api=False)
        assert out.returncode == 0, out.stderr
        # The connection admitted before the revocation: its frames no longer count.
        sock.send(_hello("gpu-rev", seq=2))
        reply = _reply(sock)
        assert reply is not None and reply.kind == "error", reply
        assert reply.body["code"] == "identity" and "no longer enrolled" in reply.body["reason"]
        # A new connection with the revoked key is refused at the handshake.
        again = cluster.dealer(ctx, "gpu-rev", enroll=False)
        again.send(_hello("gpu-rev", seq=3))
        assert _reply(again, 2000) is None
    finally:
        ctx.destroy(0)
    assert _stats(cluster)["auth"]["denied"]["unenrolled"] >= 1
    assert cluster.api("/api/v1/hosts/gpu-rev")["seq"]["contiguous"] == 1


def test_insecure_mode_works_and_warns(cluster: Cluster, tmp_path: Path) -> None:
    agg = cluster.start_aggregator(insecure=True)
    agent = cluster.start_agent(HOST, tmp_path, interval=0.3, collectors=("host",))
    wait_for(lambda: cluster.api(f"/api/v1/hosts/{HOST}")["reports"] >= 1, what="a report")
    assert "WARNING" in agg.output() and "insecure = true" in agg.output()
    assert "insecure = true" in agent.output()
    assert "auth" not in _stats(cluster)


def test_no_boot_id_in_the_unauthenticated_api(cluster: Cluster, tmp_path: Path) -> None:
    cluster.start_aggregator()
    cluster.start_agent(HOST, tmp_path, interval=0.3, collectors=("host",))
    wait_for(lambda: cluster.api(f"/api/v1/hosts/{HOST}")["reports"] >= 1, what="a report")
    (boot,) = sqlite3.connect(cluster.db).execute("SELECT DISTINCT boot FROM frames").fetchone()
    kernel_boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    for path in ("/api/v1/hosts", f"/api/v1/hosts/{HOST}", "/api/v1/stats"):
        text = json.dumps(cluster.api(path))
        assert boot not in text and kernel_boot not in text, path
    for args in (("hosts", "--json"), ("host", HOST, "--json")):
        out = cluster.cli(*args)
        assert out.returncode == 0 and boot not in out.stdout, out.stderr


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(c4_cmd(*args), capture_output=True, text=True, env=env(), cwd=REPO,
                          timeout=60)


def test_missing_or_unsafe_keys_are_clear_config_errors(tmp_path: Path) -> None:
    agg = tmp_path / "aggregator.toml"
    agg.write_text(f'listen = "tcp://127.0.0.1:1"\napi = "127.0.0.1:0"\ndb = ":memory:"\n'
                   f'server_secret_key = "{tmp_path}/nope.key_secret"\n')
    res = _run("aggregator", "run", "--config", str(agg))
    assert res.returncode == 2
    assert "server_secret_key" in res.stderr and "no such secret key file" in res.stderr
    assert "c4 keys create --server" in res.stderr and "insecure = true" in res.stderr
    assert "Traceback" not in res.stderr

    agent = tmp_path / "agent.toml"
    agent.write_text(f'host = "h1"\nserver_public_key = "{tmp_path}/server.key"\n'
                     f'run_dir = "{tmp_path}/run"\n')
    res = _run("agent", "run", "--config", str(agent))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert "no such key file" in res.stderr and "c4 keys create --host h1" in res.stderr

    # A secret others can read is refused, with the fix.
    keys.create_pair(tmp_path, "server")
    keys.create_pair(tmp_path, "h1")
    (tmp_path / "h1.key_secret").chmod(0o644)
    agent.write_text(agent.read_text() + f'secret_key = "{tmp_path}/h1.key_secret"\n')
    res = _run("agent", "run", "--config", str(agent))
    assert res.returncode == 2 and f"chmod 600 {tmp_path}/h1.key_secret" in res.stderr

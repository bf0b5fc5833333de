"""A drain hook that takes 30 s must not hold up ingest (issue 9): the aggregator runs actions
on their own thread, so while the hook sleeps, 50 hosts keep getting their acks promptly."""
from __future__ import annotations

import time
from pathlib import Path

import zmq

from c4.core import wire
from c4.core.wire import Frame

from .procs import Cluster, wait_for

HOSTS = 50


def _hello(host: str) -> dict:
    return {"agent_version": "t", "interval": 1.0, "collectors": {}, "nics": []}


def _report() -> dict:
    return {"interval": 1.0, "health": {}}


def test_a_slow_drain_hook_does_not_delay_acks(cluster: Cluster, tmp_path: Path) -> None:
    hook = tmp_path / "slow-drain"
    hook.write_text("#!/bin/sh\necho \"$1\" >> \"$0.calls\"\nsleep 30\n")
    hook.chmod(0o755)
    cluster.start_aggregator(
        "[actions]\ndry_run = false\ndrain_backend = \"exec\"\n"
        f"drain_command = [\"{hook}\", \"{{host}}\"]\ntimeout_s = 40\n"
        "[[actions.rules]]\nclasses = [\"hw_xid\"]\nmin_confidence = 0.5\nactions = [\"drain\"]\n")
    ctx = zmq.Context()
    socks = {f"gpu-{i:02d}": cluster.dealer(ctx, f"gpu-{i:02d}") for i in range(HOSTS)}
    seqs = dict.fromkeys(socks, 0)

    def send(host: str, kind: str, body: dict) -> None:
        seqs[host] += 1
        socks[host].send(wire.encode(Frame(kind, host, "b0", seqs[host], time.time(), body)))

    def acked_within(host: str, timeout: float) -> float:
        """Seconds until `host`'s latest frame is acked (fails the test past `timeout`)."""
        t0 = time.monotonic()
        while True:
            left = timeout - (time.monotonic() - t0)
            assert left > 0, f"{host}: no ack within {timeout} s"
            if socks[host].poll(int(left * 1000)):
                reply = wire.decode(socks[host].recv())
                if reply.kind == "ack" and reply.body["seq"] >= seqs[host]:
                    return time.monotonic() - t0

    try:
        for host in socks:
            send(host, "hello", _hello(host))
        for host in socks:
            acked_within(host, 10.0)
        # An Xid opens an incident whose drain runs the 30 s hook.
        send("gpu-00", "event", {"type": "xid", "severity": "critical", "device": "0000:18:00",
                                 "attrs": {"code": 79, "pci": "0000:18:00", "pid": None, "process": None,
                                           "text": "GPU has fallen off the bus."}})
        wait_for(lambda: Path(f"{hook}.calls").exists(), timeout=15, what="the drain hook to start")
        # The hook is sleeping now: every host's next report is still acked promptly.
        worst = 0.0
        for _ in range(3):
            for host in socks:
                send(host, "report", _report())
            worst = max([worst, *(acked_within(host, 5.0) for host in socks)])
        assert worst < 1.0, f"slowest ack {worst:.2f} s while the drain hook ran"
        assert Path(f"{hook}.calls").read_text().split() == ["gpu-00"]
    finally:
        for s in socks.values():
            s.close(0)
        ctx.term()

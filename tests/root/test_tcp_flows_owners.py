"""tcp_flows on the real kernel, what a hung rank leaves: a receiver process (with a job id in
its environment) is SIGSTOPped while its peer keeps sending over loopback; the collector must
report the receiver's state `T` in `owners`, and the sender's flow must count zero-window
intervals (tcp:tcp_probe's snd_wnd) once the stopped receiver's buffer is full."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from typing import Iterator

import pytest

from c4.agent.collectors.base import Context, Sample
from c4.agent.collectors.tcp_flows import TcpFlowsCollector
from tests.wire_check import validate_sample

pytestmark = pytest.mark.root

JOB = "c4-test-owners"

RECEIVER = r"""
import socket, sys, time
ls = socket.socket()
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)  # inherited by the accepted one
ls.bind(("127.0.0.1", int(sys.argv[1])))
ls.listen(1)
print("ready", flush=True)
c, _ = ls.accept()
while c.recv(1 << 16):
    time.sleep(0.01)  # a slow reader: the sender's window opens and closes, never stays shut
"""

SENDER = r"""
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
buf = b"x" * (1 << 16)
while True:
    s.sendall(buf)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def pair() -> Iterator[tuple[subprocess.Popen, subprocess.Popen, int, TcpFlowsCollector]]:
    port = free_port()
    col = TcpFlowsCollector(Context(host="test"), {"ports": [port]})
    col.start()
    env = dict(os.environ, C4_JOB_ID=JOB)
    procs: list[subprocess.Popen] = []
    try:
        rx = subprocess.Popen([sys.executable, "-c", RECEIVER, str(port)], env=env,
                              stdout=subprocess.PIPE, text=True)
        procs.append(rx)
        assert rx.stdout is not None and rx.stdout.readline().strip() == "ready"
        tx = subprocess.Popen([sys.executable, "-c", SENDER, str(port)], env=env)
        procs.append(tx)
        yield rx, tx, port, col
    finally:
        for p in procs:
            p.kill()  # SIGKILL ends a stopped process too
            p.wait()
        col.close()


def collect(col: TcpFlowsCollector, n: int, every: float = 0.5) -> list[Sample]:
    out = []
    for _ in range(n):
        time.sleep(every)
        out.append(col.collect(time.time()))
        validate_sample("tcp_flows", out[-1])
    return out


def states(s: Sample) -> dict[int, str]:
    return {o["pid"]: o["state"] for o in s.section.get("owners", []) if o["job"] == JOB}


def test_stopped_receiver_shows_in_owners_and_closes_the_senders_window(pair) -> None:
    rx, tx, port, col = pair
    running = collect(col, 3)
    assert set(states(running[-1])) == {rx.pid, tx.pid}
    assert states(running[-1])[rx.pid] in ("R", "S")

    os.kill(rx.pid, signal.SIGSTOP)
    stopped = collect(col, 6)
    assert states(stopped[-1]) == {rx.pid: "T", tx.pid: states(stopped[-1])[tx.pid]}
    assert states(stopped[-1])[tx.pid] in ("R", "S")  # blocked in sendall, alive
    # the sender's flow: its segments from the stopped receiver advertise a zero window
    zero = [f.get("zero_window_delta", 0) for s in stopped for f in s.section["flows"]
            if f["dport"] == port and f["pid"] == tx.pid]
    assert sum(zero) >= 2, zero  # more than one interval: probes keep finding it closed
    # and nothing moves any more: the idle flows drop out of the listing
    assert sum(f["bytes_acked_delta"] for f in stopped[-1].section["flows"]) == 0

    os.kill(rx.pid, signal.SIGCONT)
    resumed = collect(col, 2)
    assert states(resumed[-1])[rx.pid] in ("R", "S")

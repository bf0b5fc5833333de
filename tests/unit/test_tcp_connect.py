"""libc4-connect.so on loopback: a process with it preloaded connects with the source ports the
agent planned for that destination, falls back to an ordinary connect when they are taken,
follows a re-plan at its next connect(), and the agent's plan_result says whether the planned
port is the one the live connection uses."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Iterator

import pytest

from c4.agent.pathctl import PathControl
from c4.agent.tcp_ports import PortsFile, established, planned_ports
from tests.verbs import harness

PATHCTL = Path(__file__).resolve().parents[2] / "plugin" / "pathctl"

# Connects once per line read from stdin and prints the local port; keeps every connection.
CLIENT = r"""
import socket, sys
dst, dport = sys.argv[1], int(sys.argv[2])
keep = []
for line in sys.stdin:
    s = socket.socket()
    s.connect((dst, dport))
    keep.append(s)
    print(s.getsockname()[1], flush=True)
"""


def _libasan() -> str:
    return subprocess.run(["gcc", "-print-file-name=libasan.so"], capture_output=True,
                          text=True).stdout.strip()


@pytest.fixture(scope="module")
def built() -> None:
    if harness.missing_toolchain():
        pytest.skip(harness.missing_toolchain() or "")
    proc = subprocess.run(["make", "-j1", "-C", str(PATHCTL), "all", "asan"], capture_output=True,
                          text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(64)
    try:
        yield ls
    finally:
        ls.close()


class Client:
    def __init__(self, ports: Path, dport: int, variant: str) -> None:
        env = dict(os.environ, C4_TCP_PORTS=str(ports))
        if variant == "asan":
            env["LD_PRELOAD"] = f"{_libasan()}:{PATHCTL / 'build/asan/libc4-connect.so'}"
            env["ASAN_OPTIONS"] = "detect_leaks=0:abort_on_error=1"  # CPython's own allocations
            env["UBSAN_OPTIONS"] = "halt_on_error=1:print_stacktrace=1"
        else:
            env["LD_PRELOAD"] = str(PATHCTL / "build/libc4-connect.so")
        self.p = subprocess.Popen([sys.executable, "-c", CLIENT, "127.0.0.1", str(dport)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                  env=env)

    def connect(self) -> int:
        assert self.p.stdin and self.p.stdout
        self.p.stdin.write("\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        assert line, f"client died: rc {self.p.wait()}"
        return int(line)

    def close(self) -> None:
        assert self.p.stdin
        self.p.stdin.close()
        assert self.p.wait(timeout=10) == 0


@pytest.mark.parametrize("variant", ["plain", "asan"])
def test_planned_ports_then_fallback_then_replan(built: None, listener: socket.socket,
                                                 tmp_path: Path, variant: str) -> None:
    dport = listener.getsockname()[1]
    ports = PortsFile(tmp_path / "tcp-ports")
    ports.update({"f1": ("127.0.0.1", dport, 41001), "f2": ("127.0.0.1", dport, 41002),
                  "other": ("127.0.0.1", dport + 1, 41003)})
    assert planned_ports(ports.path, "127.0.0.1", dport) == [41001, 41002]
    c = Client(ports.path, dport, variant)
    try:
        assert c.connect() == 41001
        assert c.connect() == 41002
        third = c.connect()  # both planned 4-tuples are live: an ordinary connect
        assert third not in (41001, 41002, 41003)
        ports.update({"f3": ("127.0.0.1", dport, 41004)})  # a re-plan reaches the next connect
        assert c.connect() == 41004
        peers = sorted(listener.accept()[1][1] for _ in range(4))
        assert peers == sorted([41001, 41002, third, 41004])
    finally:
        c.close()


def test_plan_result_reports_whether_the_connection_moved(built: None, listener: socket.socket,
                                                          tmp_path: Path) -> None:
    dport = listener.getsockname()[1]
    pc = PathControl(tmp_path / "run", deadline=0.5, tcp_wait=0.5)
    pc.start()
    c = None
    try:
        def result(plan_id: str, sport: int) -> dict:
            pc.submit({"plan_id": plan_id, "assignments": [
                {"id": "t", "proto": "tcp", "sport": sport, "dst": "127.0.0.1", "dport": dport}]})
            deadline = time.monotonic() + 5
            while not (out := pc.results()):
                assert time.monotonic() < deadline
                time.sleep(0.02)
            return out[0]

        r = result("before", 42001)
        assert r["applied"] == [] and "no connection to it yet" in r["failed"][0]["reason"]
        c = Client(pc.ports.path, dport, "plain")
        assert c.connect() == 42001
        r = result("again", 42001)
        assert r["applied"] == [{"id": "t", "sport": 42001}]
        r = result("moved", 42002)  # the live connection keeps its port until it reconnects
        assert "uses port 42001: reconnect to apply" in r["failed"][0]["reason"]
        assert c.connect() == 42002
    finally:
        if c is not None:
            c.close()
        pc.close()


def test_a_reconnect_after_the_qp_deadline_is_applied(built: None, listener: socket.socket,
                                                      tmp_path: Path) -> None:
    """A job reconnects at its next step boundary, seconds after the plan (the lab's 16-host
    ring: every assignment of a plan was reported "reconnect to apply" after 2 s, and the ring
    reconnected on the planned ports later): the TCP wait is its own, longer than a QP's."""
    dport = listener.getsockname()[1]
    pc = PathControl(tmp_path / "run", deadline=0.2, tcp_wait=10.0)
    pc.start()
    c = Client(pc.ports.path, dport, "plain")
    try:
        pc.ports.update({"old": ("127.0.0.1", dport, 42101)})
        assert c.connect() == 42101
        pc.submit({"plan_id": "p", "assignments": [
            {"id": "t", "proto": "tcp", "sport": 42102, "dst": "127.0.0.1", "dport": dport,
             "old_sport": 42101}]})
        time.sleep(0.6)  # past the QP deadline: still waiting for the reconnect
        assert pc.results() == []
        assert c.connect() == 42102  # the step boundary
        deadline = time.monotonic() + 5
        while not (out := pc.results()):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert out[0]["applied"] == [{"id": "t", "sport": 42102}] and not out[0]["failed"]
    finally:
        c.close()
        pc.close()


def test_tcp_plans_are_checked_off_the_loop_thread_and_rate_limited(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """/proc/net/tcp lists every connection in the namespace: the agent's loop, which asks for
    results every 20 ms while a plan is in flight, never reads it; the socket thread reads it
    at most every TCP_RECHECK_S until the plan's TCP deadline."""
    from c4.agent import pathctl

    reads: list[str] = []

    def counted(proc_root: Path) -> list[tuple[int, str, int]]:
        reads.append(threading.current_thread().name)
        return established(proc_root)

    monkeypatch.setattr(pathctl, "established", counted)
    pc = PathControl(tmp_path / "run", deadline=1.0, tcp_wait=1.0)
    pc.start()
    try:
        pc.submit({"plan_id": "p", "assignments": [
            {"id": "t", "proto": "tcp", "sport": 42001, "dst": "192.0.2.1", "dport": 9}]})
        deadline = time.monotonic() + 5
        while not (out := pc.results()):  # as the agent's loop asks
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert "no connection to it yet" in out[0]["failed"][0]["reason"]
        assert reads and set(reads) == {"c4-pathctl"}
        assert len(reads) <= 1.0 / pathctl.TCP_RECHECK_S + 2
    finally:
        pc.close()

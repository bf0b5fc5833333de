"""The sd_notify protocol (Type=notify, WatchdogSec=) of both daemons, as systemd sees it: a
datagram socket this test binds stands in for systemd's $NOTIFY_SOCKET."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from c4.core.sdnotify import Notifier

from .procs import REPO, c4_cmd, env, free_port

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "sysfs" / "mlx5_2port"


def bind(path: Path, *, abstract: bool = False) -> tuple[socket.socket, str]:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    if abstract:
        name = f"c4-test-{os.getpid()}-{time.monotonic_ns()}"
        s.bind("\0" + name)
        addr = "@" + name
    else:
        s.bind(str(path))
        addr = str(path)
    s.settimeout(0.2)
    return s, addr


def messages(s: socket.socket, until: float, stop: str) -> list[dict[str, str]]:
    out: list[dict[str, str]] = []
    while time.monotonic() < until:
        try:
            data = s.recv(4096)
        except TimeoutError:
            continue
        out.append(dict(line.split("=", 1) for line in data.decode().splitlines()))
        if stop in out[-1]:
            break
    return out


def test_notifier_speaks_the_protocol(tmp_path: Path) -> None:
    for abstract in (False, True):
        s, addr = bind(tmp_path / "notify", abstract=abstract)
        clock = [0.0]
        n = Notifier({"NOTIFY_SOCKET": addr, "WATCHDOG_USEC": "2000000"}, clock=lambda c=clock: c[0])
        assert n.ping_every() == 0.5
        n.ready("serving")
        n.watchdog()
        n.watchdog()  # too soon: no second ping
        clock[0] = 0.6
        n.watchdog()
        n.stopping()
        got = messages(s, time.monotonic() + 2, "STOPPING")
        s.close()
        assert got[0]["READY"] == "1" and got[0]["STATUS"] == "serving"
        assert [m for m in got if "WATCHDOG" in m] == [{"WATCHDOG": "1"}] * 2
        assert got[-1]["STOPPING"] == "1"
        (tmp_path / "notify").unlink(missing_ok=True)


def test_outside_systemd_and_for_another_pid_it_stays_quiet() -> None:
    assert not Notifier({}).enabled and Notifier({}).ping_every() == float("inf")
    other = Notifier({"NOTIFY_SOCKET": "@x", "WATCHDOG_USEC": "1000000", "WATCHDOG_PID": "1"})
    assert other.watchdog_s == 0  # WATCHDOG_PID names another process


@pytest.mark.parametrize("daemon", ["aggregator", "agent"])
def test_daemons_notify_ready_status_watchdog_stopping(tmp_path: Path, daemon: str) -> None:
    s, addr = bind(tmp_path / "notify")
    zport = free_port()
    cfg = tmp_path / f"{daemon}.toml"
    if daemon == "aggregator":
        cfg.write_text(f'listen = "tcp://127.0.0.1:{zport}"\napi = "127.0.0.1:{free_port()}"\n'
                       f'db = "{tmp_path / "c4.db"}"\ninsecure = true\n')
    else:
        sysfs = tmp_path / "sys"
        shutil.copytree(FIXTURE, sysfs, symlinks=True)
        cfg.write_text(f'aggregator = "tcp://127.0.0.1:{zport}"\ninterval = 0.2\nhost = "n1"\n'
                       f'insecure = true\nsysfs_root = "{sysfs}"\nrun_dir = "{tmp_path / "run"}"\n'
                       f'metrics = "127.0.0.1:{free_port()}"\n'
                       '[collectors]\nenabled = ["rdma"]\n')
    e = dict(env(), NOTIFY_SOCKET=addr, WATCHDOG_USEC="1000000")
    p = subprocess.Popen(c4_cmd(daemon, "run", "--config", str(cfg)), env=e, cwd=REPO,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        got = messages(s, time.monotonic() + 30, "READY")
        assert got and got[-1].get("READY") == "1", (got, p.stderr)
        assert got[-1]["MAINPID"] == str(p.pid)
        more = messages(s, time.monotonic() + 2.5, "never")
        # pings land at most half the 1 s watchdog period apart
        assert sum(1 for m in more if m.get("WATCHDOG") == "1") >= 4
        assert any("STATUS" in m for m in more)
        p.send_signal(signal.SIGTERM)
        tail = messages(s, time.monotonic() + 10, "STOPPING")
        assert tail and tail[-1].get("STOPPING") == "1"
        assert p.wait(15) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        s.close()

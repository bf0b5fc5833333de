"""Running real c4 processes (aggregator, agent, CLI) on loopback for end-to-end tests."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

from c4.core import keys
from c4.core.keys import ClientKeys

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(srv: Any) -> Iterator[Any]:
    """An in-process aggregator.server.Server running its loop on a thread; stopped after."""
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.stop_event.set()
        t.join(10)


def c4_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "c4.cli", *args]


def env() -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = str(REPO) + os.pathsep + e.get("PYTHONPATH", "")
    e.pop("C4_AGGREGATOR", None)
    e["COLUMNS"] = "200"  # rich wraps tables to the terminal width; keep rows on one line
    return e


def wait_for(cond: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = cond()
        except Exception as exc:  # the process may not be up yet
            last = exc
        else:
            if last:
                return last
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}; last: {last!r}")


class Proc:
    def __init__(self, args: list[str], log: Path) -> None:
        self.log = log
        self._f = open(log, "ab")
        self.p = subprocess.Popen(args, stdout=self._f, stderr=subprocess.STDOUT, env=env(),
                                  cwd=REPO)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 10.0) -> int:
        if self.p.poll() is None:
            self.p.send_signal(sig)
            try:
                self.p.wait(timeout)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self._f.close()
        return self.p.returncode

    def output(self) -> str:
        return self.log.read_text(errors="replace")


class Cluster:
    """An aggregator and agents in tmp_path; everything is stopped by `close()`.

    CURVE is on unless `start_aggregator(insecure=True)`: the server's pair and every agent's
    pair live in tmp_path/keys, and `start_agent` enrolls its host's key first."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.zport = free_port()
        self.hport = free_port()
        self.db = tmp / "c4.db"
        self.metrics_ports: dict[str, int] = {}  # agent name -> its /metrics port
        self.keys = tmp / "keys"
        self.store = self.keys / "enrolled"
        self.insecure = False
        self.procs: list[Proc] = []
        self.aggregator: Proc | None = None

    def client_keys(self, host: str, *, enroll: bool = True) -> ClientKeys:
        """`host`'s CURVE pair (created once), enrolled in the store unless `enroll=False`."""
        for name in (keys.SERVER_NAME, host):
            if not (self.keys / f"{name}.key_secret").exists():
                keys.create_pair(self.keys, name)
        if enroll:
            keys.enroll(self.store, host, keys.load_public(self.keys / f"{host}.key"))
        return ClientKeys.load(self.keys / "server.key", self.keys / f"{host}.key_secret")

    def dealer(self, ctx: Any, host: str | None = None, *, enroll: bool = True) -> Any:
        """A raw DEALER on the ingest socket, speaking with `host`'s key (insecure: none)."""
        import zmq

        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        if host is not None and not self.insecure:
            self.client_keys(host, enroll=enroll).apply(s)
        s.connect(self.endpoint)
        return s

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.hport}"

    @property
    def endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.zport}"

    def start_aggregator(self, extra: str = "", *, insecure: bool = False) -> Proc:
        self.insecure = insecure
        if insecure:
            identity = "insecure = true\n"
        else:
            if not (self.keys / "server.key_secret").exists():
                keys.create_pair(self.keys, keys.SERVER_NAME)
            identity = (f'server_secret_key = "{self.keys / "server.key_secret"}"\n'
                        f'enrolled_keys = "{self.store}"\n')
        cfg = self.tmp / "aggregator.toml"
        cfg.write_text(f'listen = "{self.endpoint}"\napi = "127.0.0.1:{self.hport}"\n'
                       f'db = "{self.db}"\n{identity}{extra}')
        self.aggregator = Proc(c4_cmd("aggregator", "run", "--config", str(cfg)),
                               self.tmp / "aggregator.log")
        self.procs.append(self.aggregator)
        wait_for(lambda: self.api("/healthz")["ok"], what="aggregator API")
        return self.aggregator

    def start_agent(self, name: str, sysfs: Path, *, interval: float = 0.5,
                    collectors: tuple[str, ...] = ("host", "rdma"), record: Path | None = None,
                    extra: str = "") -> Proc:
        cfg = self.tmp / f"agent-{name}.toml"
        self.metrics_ports.setdefault(name, free_port())
        enabled = ", ".join(f'"{c}"' for c in collectors)
        if self.insecure:
            identity = "insecure = true\n"
        else:
            self.client_keys(name)
            identity = (f'server_public_key = "{self.keys / "server.key"}"\n'
                        f'secret_key = "{self.keys / (name + ".key_secret")}"\n')
        cfg.write_text(
            f'aggregator = "{self.endpoint}"\ninterval = {interval}\nhost = "{name}"\n{identity}'
            f'sysfs_root = "{sysfs}"\nrun_dir = "{self.tmp / ("run-" + name)}"\n'
            f'resend_after = 1.0\nmetrics = "127.0.0.1:{self.metrics_ports[name]}"\n{extra}\n'
            f'[collectors]\nenabled = [{enabled}]\n')
        args = c4_cmd("agent", "run", "--config", str(cfg))
        if record is not None:
            args += ["--record", str(record)]
        p = Proc(args, self.tmp / f"agent-{name}.log")
        self.procs.append(p)
        return p

    def api(self, path: str) -> Any:
        import urllib.request

        with urllib.request.urlopen(self.url + path, timeout=5) as r:
            return json.loads(r.read())

    def cli(self, *args: str, api: bool = True) -> subprocess.CompletedProcess:
        extra = ("--aggregator", self.url) if api else ()
        return subprocess.run(c4_cmd(*args, *extra), capture_output=True, text=True, env=env(),
                              cwd=REPO, timeout=120)

    def close(self) -> None:
        for p in self.procs:
            p.stop()

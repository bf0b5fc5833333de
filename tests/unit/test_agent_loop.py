"""The agent's loop with its collectors and sender injected: a real Sender (ZeroMQ, recording
every frame it sends to a file) and small collectors that fail or stall on purpose. One broken
or slow collector must cost only its own section, never the others' reports."""
from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from c4.agent.collectors import Collector, Context, Sample
from c4.agent.config import AgentConfig
from c4.agent.daemon import Agent
from c4.agent.sender import Sender
from c4.core import record, wire


class Steady(Collector):
    name = "host"

    def __init__(self, ctx: Context) -> None:
        super().__init__(ctx, {})
        self.calls = 0

    def collect(self, now: float) -> Sample:
        self.calls += 1
        return Sample(section={"cpu_pct": 1.0, "mem_used_bytes": 1, "mem_total_bytes": 2,
                               "load1": 0.1, "uptime_s": 10.0})


class Broken(Collector):
    name = "pfc"

    def collect(self, now: float) -> Sample:
        raise OSError(5, "Input/output error")


class Stuck(Collector):
    name = "kmsg"

    def __init__(self, ctx: Context, release: threading.Event) -> None:
        super().__init__(ctx, {})
        self.release = release
        self.calls = 0

    def collect(self, now: float) -> Sample:
        self.calls += 1
        self.release.wait(30)
        return Sample()


def _run(tmp_path: Path, collectors: list[Collector], seconds: float) -> list[wire.Frame]:
    rec = tmp_path / "sent.c4rec"
    # Nobody listens on this port: frames stay queued, and the recording shows what was sent.
    sender = Sender("tcp://127.0.0.1:9", "h1", record_path=str(rec), validate_every=1)
    cfg = AgentConfig(aggregator="tcp://127.0.0.1:9", host="h1", interval=0.3, metrics="",
                      run_dir=tmp_path / "run", collectors={"enabled": []})
    agent = Agent(cfg, sender=sender, collectors=collectors)
    t = threading.Thread(target=agent.run, daemon=True)
    t.start()
    time.sleep(seconds)
    agent.stop_event.set()
    t.join(15)
    assert not t.is_alive()
    return [wire.decode(b) for b in record.read(rec)]


def _reports(frames: list[wire.Frame]) -> list[dict[str, Any]]:
    return [f.body for f in frames if f.kind == "report"]


def test_a_failing_collector_is_unhealthy_and_the_others_go_on(tmp_path: Path) -> None:
    steady = Steady(Context(host="h1"))
    reports = _reports(_run(tmp_path, [steady, Broken(Context(host="h1"), {})], 1.5))
    assert len(reports) >= 3
    for r in reports:
        assert r["health"]["pfc"] == {"ok": False, "reason": "OSError: [Errno 5] Input/output error"}
        assert r["health"]["host"] == {"ok": True} and "host" in r
        assert "pfc" not in r


def test_a_stuck_collector_does_not_delay_the_others(tmp_path: Path) -> None:
    release = threading.Event()
    steady = Steady(Context(host="h1"))
    stuck = Stuck(Context(host="h1"), release)
    try:
        frames = _run(tmp_path, [steady, stuck], 2.0)
    finally:
        release.set()
    reports = _reports(frames)
    # Interval 0.3 s: a loop waiting on the stuck collector would have sent at most one report.
    assert len(reports) >= 4, [r["health"] for r in reports]
    assert all("host" in r for r in reports)
    slow = [r["health"]["kmsg"] for r in reports]
    assert all(not h["ok"] and h["reason"].startswith("slow: collect() still running") for h in slow)
    assert steady.calls >= len(reports)
    # Asked once, not once per interval: the stuck call is not stacked up.
    assert stuck.calls == 1

"""The agent's main loop: start collectors, say hello, report every interval, stop cleanly.

collectors -> Sample (section + events) -> report/event frames -> Sender (queue, acks, resend).
A collector that cannot start is disabled with one log line and a health flag; one that fails
or is still busy at the report deadline (agent/runner.py: each collector has its own thread) is
marked unhealthy for that interval and the rest keep reporting on time.
"""
from __future__ import annotations

import logging
import os
import platform
import signal
import socket
import threading
import time
from pathlib import Path
from typing import Any, Callable

import msgpack

from c4 import __version__
from c4.core.wire import Invalid, kinds
from c4.core.wire.sections import SECTIONS
from c4.core.sdnotify import Notifier

from . import collectors as registry
from .collectors import Collector, CollectorUnavailable, Context, OptionError, Sample
from . import bpf_stats
from .config import AgentConfig
from .planning import Planning
from .exporter import AgentMetrics, Exporter, Snapshot
from .netdevs import netdevs
from .runner import CollectorRunner
from .sender import Sender

log = logging.getLogger("c4.agent")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


class Agent:
    def __init__(self, cfg: AgentConfig, *, record_path: str | None = None,
                 clock: Callable[[], float] = time.time, sender: Sender | None = None,
                 collectors: list[Collector] | None = None) -> None:
        """`sender` and `collectors` replace the ones the config describes (tests, embedding):
        the outside world is injected, as the collectors' Context does for sysfs and /proc."""
        self.cfg = cfg
        self.clock = clock
        self.host = cfg.host or socket.gethostname()
        self.ctx = Context(host=self.host, sysfs_root=cfg.sysfs_root, proc_root=cfg.proc_root,
                           dev_root=cfg.dev_root, run_dir=cfg.run_dir, clock=clock, log=log)
        self.health: dict[str, dict[str, Any]] = {}
        self.collectors: list[Collector] = []
        self._given = collectors
        self.runners: list[CollectorRunner] = []
        self.sections_dropped = 0  # sections and events of untrusted collectors (_check)
        self.stop_event = threading.Event()
        if sender is not None:
            self.sender = sender
        else:
            self.sender = self._sender(cfg, record_path, clock)
        # C4P: probes and plans (agent/planning.py)
        self.c4p = Planning(cfg.run_dir, tcp_wait=cfg.plan_tcp_wait)
        self.sender.handlers["plan"] = self.c4p.on_plan
        self.sender.handlers["probe"] = self.c4p.on_probe
        self.snapshot = Snapshot()  # replaced whole each interval; the exporter reads it
        self.metrics = AgentMetrics(lambda: self.snapshot, self._delivery_counters,
                                    infiniband=cfg.metrics_infiniband, bpf=cfg.bpf_stats)
        self.exporter: Exporter | None = None
        self.notify = Notifier()

    def _sender(self, cfg: AgentConfig, record_path: str | None,
                clock: Callable[[], float]) -> Sender:
        curve = cfg.curve_keys(self.host)  # ConfigError before anything starts
        if curve is None:
            log.warning("insecure = true: sending to %s over plain TCP, unauthenticated and "
                        "unencrypted; use CURVE keys outside tests (docs/security.md)",
                        cfg.aggregator)
        return Sender(cfg.aggregator, self.host, queue_max=cfg.queue_max,
                      queue_bytes=cfg.queue_bytes, spool_dir=cfg.spool_dir or None,
                      resend_after=cfg.resend_after, max_frame=cfg.max_frame,
                      record_path=record_path, validate_every=cfg.validate_every,
                      clock=clock, log=log, curve=curve)

    # -- lifecycle ------------------------------------------------------------------------
    def start_collectors(self) -> None:
        if self._given is not None:
            for collector in self._given:
                self._start(collector)
            return
        for name in self.cfg.enabled:
            cls = registry.load(name)
            self._start(cls(self.ctx, self.cfg.options(name)))  # OptionError propagates: bad config

    def _start(self, collector: Collector) -> None:
        try:
            collector.start()
        except CollectorUnavailable as exc:
            log.warning("collector %s disabled: %s", collector.name, exc)
            self.health[collector.name] = {"ok": False, "reason": str(exc)}
            return
        self.health[collector.name] = {"ok": True}
        self.collectors.append(collector)
        self.runners.append(CollectorRunner(collector))

    def hello_body(self) -> dict[str, Any]:
        body: dict[str, Any] = {"agent_version": __version__, "interval": self.cfg.interval,
                                "collectors": self.health, "nics": [],
                                "kernel": platform.release()}
        boot_id = _read(self.cfg.proc_root / "sys/kernel/random/boot_id")
        if boot_id:
            body["kernel_boot_id"] = boot_id
        if self.cfg.labels:
            body["labels"] = dict(self.cfg.labels)
        try:
            body["netdevs"] = netdevs()
        except OSError as exc:  # best effort, like the inventory below
            log.warning("cannot list network interfaces: %s", exc)
        for c in self.collectors:
            try:
                inv = c.inventory()
            except Exception as exc:  # inventory is best effort; the reports still flow
                log.warning("collector %s: inventory failed: %s", c.name, exc)
                continue
            if inv:
                body.update(inv)
        self.snapshot = Snapshot(self.snapshot.sections, self.snapshot.health,
                                 self.snapshot.durations, body.get("nics", []))
        return body

    def _delivery_counters(self) -> dict[str, int]:
        st = self.sender.stats
        return {**self.sender.counters(), "sent": st.sent, "acked": st.acked}

    def start_exporter(self) -> None:
        """Bind /metrics (an address in use is an OSError: the agent does not start) and, with
        BPF programs loaded, turn on their run-time statistics."""
        if self.cfg.metrics:
            self.exporter = Exporter(self.metrics, self.cfg.metrics)
            log.info("metrics on http://%s/metrics", self.exporter.address)
        if self.cfg.bpf_stats and bpf_stats.own_programs():
            try:
                self.metrics.bpf_stats_fd = bpf_stats.enable_stats()
            except OSError as exc:
                log.warning("BPF run-time statistics unavailable: %s", exc)

    def collect_once(self, now: float, interval: float) -> None:
        body: dict[str, Any] = {"interval": interval, "health": {}}
        events = []
        sections: dict[str, Any] = {}
        raw: dict[str, bytes] = {}  # sections their collector encoded (sent as they are)
        durations: dict[str, float] = {}
        for r in self.runners:
            r.request(now)  # a runner still busy with an earlier call is not asked again
        # Everyone gets until half an interval (at most 2 s) from now; the report goes out then.
        deadline = time.monotonic() + min(self.cfg.interval / 2, 2.0)
        for r in self.runners:
            out = r.wait(deadline)
            if out is None:
                reason = f"slow: collect() still running after {r.busy_for():.1f}s"
                if not self.health[r.name].get("reason", "").startswith("slow"):
                    log.warning("collector %s: %s; the others report without it", r.name, reason)
                self.health[r.name] = {"ok": False, "reason": reason}
                continue
            durations[r.name] = out.duration_s
            if out.error is not None:  # one broken collector must not stop the others
                reason = f"{type(out.error).__name__}: {out.error}"
                if self.health[r.name].get("reason") != reason:
                    log.error("collector %s failed: %s", r.name, reason,
                              exc_info=(type(out.error), out.error, out.error.__traceback__))
                self.health[r.name] = {"ok": False, "reason": reason[:500]}
                continue
            self.health[r.name] = {"ok": True}
            sample = out.sample
            assert sample is not None
            if r.collector.untrusted:
                self._check(r.name, sample)
            if sample.section is not None:
                body[r.name] = sections[r.name] = sample.section
                if sample.encoded is not None:
                    raw[r.name] = sample.encoded
            events.extend(sample.events)
        body["health"] = dict(self.health)
        self.snapshot = Snapshot(sections, dict(self.health), durations, self.snapshot.nics)
        body["sender"] = {**self.sender.counters(), "sections_dropped": self.sections_dropped}
        self.sender.send("report", body, raw)
        for ev in events:
            self.sender.send("event", ev.body())

    def _check(self, name: str, sample: Sample) -> None:
        """An untrusted collector's output against the wire schema: a bad or oversized section
        is dropped alone (health says why, `sender.sections_dropped` counts it), a bad event
        alone; everything else in the report goes out."""
        reason = None
        if sample.section is not None:
            try:
                SECTIONS[name].check(sample.section, name)
                size = (len(sample.encoded) if sample.encoded is not None  # not encoded twice
                        else len(msgpack.packb(sample.section)))
                if size > self.cfg.max_frame // 2:
                    reason = f"section of {size} bytes is over half of max_frame"
            except (Invalid, ValueError, OverflowError, TypeError) as exc:
                reason = f"invalid section: {exc}"
        good = []
        for ev in sample.events:
            try:
                kinds.validate_body("event", ev.body())
                good.append(ev)
            except (Invalid, ValueError, OverflowError, TypeError) as exc:
                self.sections_dropped += 1
                log.warning("collector %s: dropped an invalid %s event: %s", name, ev.type,
                            str(exc)[:200])
        sample.events[:] = good
        if reason is None:
            return
        self.sections_dropped += 1
        if self.health[name].get("reason") != reason[:500]:
            log.error("collector %s: %s; the rest of the report goes out", name, reason[:200])
        self.health[name] = {"ok": False, "reason": reason[:500]}
        sample.section = None

    def run(self) -> int:
        self.start_collectors()
        self.c4p.start()
        self.snapshot = Snapshot(health=dict(self.health))
        self.start_exporter()
        self.sender.send("hello", self.hello_body())
        next_hello = self.clock() + self.cfg.hello_interval
        names = ", ".join(c.name for c in self.collectors) or "no collectors"
        log.info("agent %s reporting to %s every %.3gs with %s", self.host, self.cfg.aggregator,
                 self.cfg.interval, names)
        self.notify.ready(f"reporting to {self.cfg.aggregator} with {names}")
        last = self.clock()
        next_at = last + self.cfg.interval
        while not self.stop_event.is_set():
            # Come round at least every ping period: a loop stuck anywhere stops the pings.
            self.notify.watchdog()
            self.sender.poll(max(0.0, min(next_at - self.clock(), self.notify.ping_every(),
                                          self.c4p.poll_interval() or float("inf"))))
            for kind, body in self.c4p.ready():
                self.sender.send(kind, body)
            if self.stop_event.is_set():
                break
            now = self.clock()
            if now < next_at:
                continue
            if now >= next_hello:
                self.sender.send("hello", self.hello_body())
                next_hello = now + self.cfg.hello_interval
            self.collect_once(now, now - last)
            last = now
            self._status()
            # Skip missed ticks instead of bursting to catch up after a stall.
            next_at = max(next_at + self.cfg.interval, now + self.cfg.interval / 2)
        self.shutdown()
        return 0

    def _status(self) -> None:
        down = sorted(n for n, h in self.health.items() if not h.get("ok"))
        self.notify.status(f"{self.sender.last_seq} frames sent, {self.sender.unacked} unacked"
                           + (f"; collectors down: {', '.join(down)}" if down else ""))

    def shutdown(self) -> None:
        self.notify.stopping()
        if self.exporter is not None:
            self.exporter.close()
        # Give the queue a moment to drain so a clean stop loses nothing that was collected.
        deadline = self.clock() + 2.0
        while self.sender.unacked and self.clock() < deadline:
            self.sender.poll(0.05)
        for r in self.runners:
            r.close()
        for c in self.collectors:
            try:
                c.close()
            except Exception:
                log.exception("collector %s failed to close", c.name)
        self.c4p.close()
        log.info("agent stopped: %d frames sent, %d unacked", self.sender.last_seq,
                 self.sender.unacked)
        self.sender.close()
        if self.metrics.bpf_stats_fd is not None:
            os.close(self.metrics.bpf_stats_fd)


def run(cfg: AgentConfig, record_path: str | None = None) -> int:
    try:
        agent = Agent(cfg, record_path=record_path)
    except OptionError as exc:
        log.error("%s", exc)
        return 2

    def _stop(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping", signum)
        agent.stop_event.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        return agent.run()
    except OptionError as exc:
        log.error("%s", exc)
        agent.sender.close()
        return 2


__all__ = ["Agent", "run"]

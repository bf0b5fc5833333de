"""C4D: detect, localise and record faults from the agents' reports (docs/diagnosis.md).

`Diagnosis` is fed by ingest (every accepted frame, then a tick about every second) and read by
the API thread; one lock guards both. All times are the aggregator's arrival clock, kept
monotonic here; the only durations taken from a host are measured on that host.
"""
from __future__ import annotations

import logging
import sqlite3
import threading
from collections import Counter
from typing import Any, Callable

from c4.core.wire import Frame

from .config import DiagnosisConfig
from .counters import Counters
from .findings import Finding
from .hang import HangDetector
from .hardware import Hardware
from .incidents import Incidents
from .loss import LossDetector
from .model import Comm, Model, PathSource
from .outage import OutageDetector
from .probes import Measurer, Measuring, Prober
from .slow import SlowDetector
from .straggler import StragglerDetector
from .tcp import TcpDetector

__all__ = ["Diagnosis", "DiagnosisConfig"]

HOST_SWEEP_S = 60.0  # how often hosts silent past `host_expire_s` are looked for


class Diagnosis:
    def __init__(self, db: sqlite3.Connection, cfg: DiagnosisConfig, topology: Any,
                 actions: Any, log: logging.Logger) -> None:
        self.cfg = cfg
        self.log = log
        self.lock = threading.RLock()
        self.model = Model(topology)
        self.model.max_comms = cfg.max_comms
        self.counters = Counters(cfg)
        self.hang = HangDetector(cfg, self.model)
        self.prober = Prober(self.model)
        self.measuring = Measuring(self.model, cfg.localise_confidence)
        self.slow = SlowDetector(cfg, self.model, self.counters, self.prober)
        self.straggler = StragglerDetector(cfg)
        self.loss = LossDetector(cfg, self.model)
        self.tcp = TcpDetector(cfg, self.model)
        self.hardware = Hardware(cfg, self.model)
        self.outage = OutageDetector(cfg, self.model, self.hardware.carrier_lost)
        self.store = Incidents(db, cfg, actions, log)
        self.clock = 0.0
        self.heard: dict[str, float] = {}  # host -> arrival of its latest frame (any kind)
        self.swept = 0.0  # the latest look for hosts to forget
        self.hosts_expired = 0
        self.errors: Counter[str] = Counter()  # frames diagnosis could not use, by reason

    @classmethod
    def from_config(cls, db: sqlite3.Connection, cfg: DiagnosisConfig, topology: Any,
                    actions: Any, log: logging.Logger) -> "Diagnosis":
        return cls(db, cfg, topology, actions, log)

    def _now(self, now: float) -> float:
        self.clock = self.model.now = max(self.clock, now)
        return self.clock

    def use_paths(self, source: PathSource) -> None:
        """Learned paths (C4P's probes) for NIC pairs the topology has none for, and probes
        asked for when a fault's candidate links could be separated (probes.py)."""
        with self.lock:
            self.model.paths = source

    def sent_to_hosts(self, comm: str, rank: int) -> dict[str, int] | None:
        """Model.sent_to_hosts (C4P weighs a process's QPs by it)."""
        with self.lock:
            return self.model.sent_to_hosts(comm, rank)

    def use_measurer(self, measurer: Measurer) -> None:
        """What measures the candidate links of a path finding (probes.py): the agents by
        default, the simulator in a replay of its run."""
        with self.lock:
            self.measuring.measurer = measurer

    def use_routes(self, routed: Callable[[str], bool]) -> None:
        """Which hosts the server can send to (a host connected to this aggregator): measuring
        probes are asked of those only (federation: a leaf's hosts may report elsewhere)."""
        with self.lock:
            self.measuring.routed = routed

    def take_outbox(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(host, kind, body) frames for the agents: measuring probes (call under the lock)."""
        with self.lock:
            return self.measuring.take_outbox()

    # -- inputs ---------------------------------------------------------------------------
    def observe(self, frame: Frame, now: float) -> None:
        with self.lock:
            now = self._now(now)
            self.heard[frame.host] = now
            try:
                if frame.kind == "report":
                    self._report(frame.host, frame.body, now)
                elif frame.kind == "event":
                    self._event(frame.host, frame.body, now)
                elif frame.kind == "hello":
                    self.model.on_hello(frame.host, frame.body)
                elif frame.kind == "probe_result":
                    self.measuring.on_result(frame.host, frame.body, now)
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                # Ingest validated the frame; a section we do not understand loses only itself.
                self.errors[f"{frame.kind}:{type(exc).__name__}"] += 1
                if self.errors[f"{frame.kind}:{type(exc).__name__}"] == 1:
                    self.log.warning("diagnosis skipped a %s from %s: %r", frame.kind,
                                     frame.host, exc)

    def _report(self, host: str, body: dict[str, Any], now: float) -> None:
        interval = float(body.get("interval") or self.model.host(host).interval or 1.0)
        self.model.reported[host] = now
        nccl = body.get("nccl")
        if nccl:
            for s in nccl.get("comms", []):
                comm, rk = self.model.on_comm(host, s, interval, now)
                self.slow.on_report(comm, rk, now)
                self.loss.on_sends(comm, rk, now)
        rdma = body.get("rdma")
        if rdma:
            self.counters.on_rdma(host, rdma, interval)
            self.loss.on_rdma(host, rdma, interval, now)
            self.outage.on_rdma(host, rdma, interval, now)
            self.hardware.on_rdma(host, rdma, now)
        flows = body.get("tcp_flows")
        if isinstance(flows, dict):
            self.model.on_owners(host, flows.get("owners") or [], now)
            self.model.on_socks(host, flows, self.cfg.tcp_min_bytes)
            self.tcp.on_report(host, flows, interval, now)
            self.outage.on_flows(host, flows, now)

    def _event(self, host: str, body: dict[str, Any], now: float) -> None:
        if body["type"] == "nccl_stall":
            a = body["attrs"]
            comm = self.model.comms.get(a["comm"])
            rk = comm.ranks.get(a["rank"]) if comm else None
            if comm is not None and rk is not None and rk.host == host:
                rk.stall = a
                self.outage.on_stall(comm, rk, a, now)
            return
        self.hardware.on_event(host, body, now)

    def host_silent(self, host: str, last_seen: float, now: float) -> None:
        with self.lock:
            self._now(now)
            self.hardware.host_silent(host, last_seen)

    def host_back(self, host: str, now: float) -> None:
        with self.lock:
            self._now(now)
            self.hardware.host_back(host)

    # -- evaluation -----------------------------------------------------------------------
    def tick(self, now: float) -> None:
        with self.lock:
            now = self._now(now)
            self.measuring.collect(now)
            findings: list[Finding] = []
            for comm in list(self.model.comms.values()):
                comm.update_pace()
                findings += self.hang.tick(comm, now)
                findings += self.slow.tick(comm, now)
                findings += self.straggler.tick(comm, now)
                for r in comm.ranks.values():
                    r.fresh = False
            findings += self.loss.tick(now)
            findings += self.outage.tick(now)
            findings += self.tcp.tick(now)
            findings += self.hardware.tick(now)
            # Hardware first: a symptom then joins the incident of its cause.
            findings.sort(key=lambda f: f.cls.startswith("hw_") is False)
            for f in findings:
                f = self.measuring.resolve(f, now)
                self.store.report(f, now)
                if f.top is not None and f.top.kind in ("path", "link"):
                    self.prober.separate(f.evidence.get("candidate_links") or (), now)
            self.store.tick(now)
            for comm in self.model.expire(now, self.cfg.comm_expire_intervals,
                                          self.cfg.comm_expire_max_s):
                self.hang.forget(comm)
            self.hang.expire(now)
            self.prober.forget(now)
            if now - self.swept >= HOST_SWEEP_S:
                self.swept = now
                self._expire_hosts(now)

    def _expire_hosts(self, now: float) -> None:
        """Forget the per-host state of hosts silent past `host_expire_s` that no open
        incident and no live communicator still names: diagnosis never forgot a host, so
        names invented by a peer (or hosts long decommissioned) grew its memory for good."""
        gone = {h for h, t in self.heard.items() if now - t > self.cfg.host_expire_s}
        if not gone:
            return
        for inc in self.store.open():
            gone.difference_update(s.get("host") for s in inc.suspects)
            gone.difference_update(k.partition(":")[2].partition("/")[0] for k in inc.keys
                                   if k.startswith(("host:", "nic:")))
        for comm in self.model.comms.values():
            gone.difference_update(r.host for r in comm.ranks.values())
        if not gone:
            return
        for h in gone:
            del self.heard[h]
        self.model.forget_hosts(gone)
        self.counters.forget_hosts(gone)
        self.loss.forget_hosts(gone)
        self.tcp.forget_hosts(gone)
        self.hardware.forget_hosts(gone)
        self.hosts_expired += len(gone)

    # -- queries (API thread) -------------------------------------------------------------
    def incidents(self, state: str | None = None) -> list[dict[str, Any]]:
        with self.lock:
            return self.store.query(state)

    def incident(self, incident_id: int) -> dict[str, Any] | None:
        with self.lock:
            return self.store.get(incident_id)

    def jobs(self) -> list[dict[str, Any]]:
        with self.lock:
            now = self.clock
            by_job: dict[str, list[Comm]] = {}
            for c in self.model.comms.values():
                by_job.setdefault(c.job, []).append(c)
            open_by_job: dict[str, list[int]] = {}
            for inc in self.store.open():
                if inc.job:
                    open_by_job.setdefault(inc.job, []).append(inc.id)
            out = []
            for job in sorted(set(by_job) | set(self.model.flows)):
                comms = by_job.get(job, [])
                hosts = sorted({h for c in comms for h in c.hosts()} |
                               set(self.model.flows.get(job, {})))
                out.append({
                    "job": job, "hosts": hosts,
                    "ranks": max((c.nranks for c in comms), default=0),
                    "comms": [self._comm_summary(c, now) for c in comms],
                    "flows": sum(self.model.flows.get(job, {}).values()),
                    "open_incidents": sorted(open_by_job.get(job, [])),
                })
            return out

    def _comm_summary(self, c: Any, now: float) -> dict[str, Any]:
        stale = self.cfg.stale_intervals * c.interval
        live = [r for r in c.ranks.values() if now - r.seen <= stale]
        done = [r.seq_completed for r in live]
        inflight = [r for r in live if r.inflight]
        stalled = sum(1 for r in inflight
                      if (r.inflight.get("progress_age_s") or 0) >= self.hang.threshold(c))
        # a stall of the first collective (nothing completed yet) is still a stall
        state = "stalled" if stalled else "starting" if not done or max(done) == 0 else "running"
        return {"comm": c.comm, "nranks": c.nranks, "ranks_reporting": len(live),
                "hosts": len(c.hosts()), "state": state,
                "seq_completed": [min(done), max(done)] if done else None,
                "op_period_s": round(c.period, 4) if c.period else None}

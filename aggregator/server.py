"""`c4 aggregator run`: the ZeroMQ ROUTER ingest loop, the API thread, periodic ticks.

Threads and the one lock (every other module refers here):
- the main thread reads the ROUTER socket and decodes and validates frames without the lock,
  then applies them (ingest, state, diagnosis) in arrival order and runs the diagnosis tick,
  each under `Server.lock`;
- the HTTP API's threads read state and SQLite under the same lock, so a reader never sees a
  frame half applied;
- the actions worker (actions.py) runs commands and webhooks on its own thread with its own
  SQLite connection and takes no lock: incidents reach it through a bounded queue and its
  records come back at the next tick. So nothing slow ever runs under the lock.
SQLite is in WAL mode: the worker's writes and the main connection's do not block readers.
"""
from __future__ import annotations

import logging
import signal
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

import zmq

from c4.core import config as c4config
from c4.core import wire
from c4.core.keys import EnrolledKeys
from c4.core.sdnotify import Notifier

from .alerts import Alerts, AlertsConfig
from .api import Api, serve
from .auth import ZapHandler, curve_server
from .checkpoint import Checkpointer
from .config import AggregatorConfig
from .federation import Federation, FederationConfig
from .ingest import Ingest
from .metrics import ClusterMetrics, FederationMetrics
from .planner.metrics import PlanMetrics
from .state import HostRegistry
from .store import Store, connect

log = logging.getLogger("c4.aggregator")
TICK_S = 1.0
INGEST_QUEUE_BYTES = 64 << 20
# Work per hold of the global lock: then it is released (API, ticks) and taken again.
DRAIN_FRAMES = 512
DRAIN_BYTES = 16 << 20
PRUNE_S = 60.0


@dataclass
class Core:
    """Everything between a raw frame and an incident, wired once for live ingest and replay."""

    store: Store
    registry: HostRegistry
    diagnosis: Any
    ingest: Ingest
    actions: Any  # ActionRunner (inline) or ActionWorker (thread)
    planner: Any = None  # C4P (planner/service.py); None without a topology


def build_core(cfg: AggregatorConfig, *, db_path: str | None = None, topology: Any = None,
               clock: Callable[[], float] = time.time, check_same_thread: bool = True,
               worker: bool = False) -> Core:
    from c4.core.topology import Topology

    from .actions import ActionRunner, ActionsConfig, ActionWorker
    from .diagnosis import Diagnosis
    from .diagnosis.config import DiagnosisConfig
    from .planner.service import Sinks, build_planner

    conn = connect(db_path or cfg.db, check_same_thread=check_same_thread)
    store = Store(conn)
    registry = HostRegistry()
    if topology is None and cfg.topology:
        topology = Topology.load(cfg.topology)
    acfg = c4config.build(ActionsConfig, cfg.actions, "actions")
    alog = logging.getLogger("c4.aggregator.actions")
    path = str(db_path or cfg.db)
    # Live: commands run on the worker's thread, never under the ingest lock. In memory
    # (replay, tests) there is no second connection to give it: run inline, deterministically.
    actions: ActionRunner | ActionWorker = (
        ActionRunner(acfg, conn, alog, clock) if path == ":memory:" or not worker
        else ActionWorker(acfg, path, alog, clock))
    diagnosis = Diagnosis.from_config(
        conn, c4config.build(DiagnosisConfig, cfg.diagnosis, "diagnosis"), topology, actions,
        logging.getLogger("c4.aggregator.diagnosis"))
    # C4P reads diagnosis' incidents, so diagnosis sees each frame first
    planner = build_planner(cfg.planning, conn, topology, diagnosis, cfg.name)
    ingest = Ingest(store, registry, Sinks(diagnosis, planner) if planner else diagnosis,
                    name=cfg.name, max_frame=cfg.max_frame,
                    silent_after=cfg.silent_after, retention_s=cfg.frames_retention_s,
                    retention_bytes=cfg.frames_retention_bytes,
                    max_hosts=cfg.max_hosts, host_expiry_s=cfg.host_expiry_s, log=log)
    return Core(store, registry, diagnosis, ingest, actions, planner)


class Server:
    def __init__(self, cfg: AggregatorConfig, clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.clock = clock
        keys = cfg.curve_keys()  # config errors before anything starts
        token = cfg.api_token()
        fcfg = c4config.build(FederationConfig, cfg.federation, "federation")
        self.lock = threading.Lock()
        # One lock for ingest, ticks and the API (see the module docstring).
        self.core = build_core(cfg, clock=clock, check_same_thread=False, worker=True)
        # WAL checkpoints (fsyncs) on their own thread, not inside an ingest commit
        self.checkpointer = (None if str(cfg.db) == ":memory:" else
                             Checkpointer(str(cfg.db), self.core.store.conn))
        self.api = Api(self.core.ingest, self.core.diagnosis, self.lock, clock)
        self.api.planner = self.core.planner
        if self.core.planner is not None:
            self.api.metrics.register(PlanMetrics(self.lock, self.core.planner))
        acfg = c4config.build(AlertsConfig, cfg.alerts, "alerts")
        if not acfg.external_url:
            acfg.external_url = f"http://{cfg.api}"
        self.alerts = Alerts(acfg, logging.getLogger("c4.aggregator.alerts"), clock)
        self.api.alerts = self.alerts
        self.cluster_metrics = ClusterMetrics(
            self.lock, lambda: self.core.registry.hosts.values(), self.core.store.conn,
            self.core.diagnosis, clock, db_path=str(cfg.db),
            host_counters=cfg.metrics_host_counters, alerts=self.alerts)
        self.api.metrics.register(self.cluster_metrics)
        self.notify = Notifier()
        self.stop_event = threading.Event()
        self.zctx = zmq.Context()
        self.sock = self.zctx.socket(zmq.ROUTER)
        self.sock.setsockopt(zmq.LINGER, 0)
        # ZeroMQ cuts off peers sending over twice the limit (memory protection); frames between
        # the limit and twice it reach ingest and are rejected and counted as too_large.
        self.sock.setsockopt(zmq.MAXMSGSIZE, 2 * cfg.max_frame)
        self.sock.setsockopt(zmq.ROUTER_HANDOVER, 1)  # a reconnecting agent takes over its route
        # Memory by bytes, not messages: ZeroMQ holds at most this many unread frames per agent
        # connection (then TCP pushes back and the agent keeps them), so a flood of large
        # frames costs at most INGEST_QUEUE_BYTES per connection.
        self.sock.setsockopt(zmq.RCVHWM, max(8, INGEST_QUEUE_BYTES // cfg.max_frame))
        self.sock.setsockopt(zmq.HEARTBEAT_IVL, 2000)
        self.sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 6000)
        # Every agent reconnects at once after an aggregator restart: ZeroMQ's default listen
        # backlog (100) drops the rest of the SYNs, and each retry waits 1, 3, 7 s in the kernel.
        self.sock.setsockopt(zmq.BACKLOG, 4096)
        # Identity (docs/security.md): CURVE, and a ZAP handler that admits enrolled keys only.
        self.enrolled: EnrolledKeys | None = None
        self.zap: ZapHandler | None = None
        if keys is None:
            log.warning("insecure = true: ingest on %s is plain TCP; any peer that reaches it "
                        "can speak for any host (docs/security.md)", cfg.listen)
        else:
            self.enrolled = EnrolledKeys(cfg.enrolled_keys, log)
            if not len(self.enrolled):
                log.warning("no agent key enrolled in %s yet: no agent can connect until one "
                            "is (`c4 keys enroll`; no restart needed)", cfg.enrolled_keys)
            self.zap = ZapHandler(self.zctx, self.enrolled, log)
            curve_server(self.sock, *keys)
        self.api.auth = self.zap
        self.api.token = token
        self.sock.bind(cfg.listen)
        self.routes: dict[str, bytes] = {}  # host -> ZeroMQ routing id of its latest frame
        # C4D measures from hosts it can reach: under federation a leaf's hosts may report
        # to another aggregator
        self.core.diagnosis.use_routes(self.routes.__contains__)
        # Jobs that span pods (federation.py): their sections go to their owner after the
        # commit, and peers' forwards of the jobs this aggregator owns come in.
        self.federation: Federation | None = None
        if fcfg.enabled:
            self.federation = Federation(fcfg, self.core.ingest.boot, keys, cfg.max_frame,
                                         self.core.ingest.prepare, self.core.registry,
                                         logging.getLogger("c4.aggregator.federation"),
                                         self.core.diagnosis.cfg.host_expire_s)
            self.core.ingest.federation = self.federation
            self.api.metrics.register(FederationMetrics(self.federation))
        self.httpd = serve(self.api, cfg.api)
        log.info("aggregator listening on %s, API on http://%s", cfg.listen, cfg.api)

    def _send(self, peer: bytes, frame: wire.Frame) -> None:
        try:
            self.sock.send_multipart([peer, wire.encode(frame)], zmq.NOBLOCK)
        except zmq.Again:
            pass  # a peer that does not read its replies loses them; acks are idempotent
        except zmq.ZMQError as exc:
            log.debug("reply to a vanished peer dropped: %s", exc)
        except Exception as exc:  # our reply failed its own check: drop it, keep serving
            self.core.ingest.internal_error("reply", exc, self.clock())

    def _planner_frames(self, now: float) -> list[tuple[str, wire.Frame]]:
        """C4P's probe and plan frames and C4D's measuring probes (call under the lock)."""
        planner = self.core.planner
        out = planner.take_outbox() if planner is not None else []
        out += self.core.diagnosis.take_outbox()
        return [(host, self.core.ingest.make_frame(kind, body, now)) for host, kind, body in out]

    def _send_to_hosts(self, frames: list[tuple[str, wire.Frame]]) -> None:
        for host, frame in frames:
            peer = self.routes.get(host)
            if peer is None:  # never connected since the aggregator started: nowhere to send
                log.warning("no connection from %s: its %s frame is dropped", host, frame.kind)
                continue
            self._send(peer, frame)

    def _drain(self) -> None:
        """Read and decode the frames waiting, up to DRAIN_FRAMES / DRAIN_BYTES, without the
        lock; then, under it, admit them in arrival order in one transaction and ack each host
        once after the commit. The loop comes back for the rest after the lock was free for
        the API and ticks."""
        ingest = self.core.ingest
        if self.enrolled is not None:
            self.enrolled.refresh()  # one stat(): revocations apply from this batch on
        received = self._receive()
        if not received:
            return
        with self.lock, ingest.batch():  # one transaction per drain; acks after its commit
            for peer, data, prepared in received:
                if prepared is None:
                    # DEALER sends exactly one frame: anything else is not a c4 agent.
                    ingest.rejected["malformed"] += 1
                    continue
                try:
                    out = ingest.admit(prepared, data, self.clock())
                    if out.frame is not None:
                        self.routes[out.frame.host] = peer
                    for reply in out.replies:
                        self._send(peer, reply)
                except Exception as exc:  # the last guard: one frame, never the process
                    ingest.internal_error("ingest", exc, self.clock())
            acks = ingest.take_acks(self.clock())
        for host, ack in acks:
            route = self.routes.get(host)
            if route is not None:
                self._send(route, ack)

    def _receive(self) -> list[tuple[bytes, bytes, wire.Frame | Exception | None]]:
        """(peer, frame bytes, what Ingest.prepare made of them; None: not one frame) for the
        frames waiting, in arrival order. Decoding touches no state the lock guards."""
        out: list[tuple[bytes, bytes, wire.Frame | Exception | None]] = []
        budget = DRAIN_BYTES
        for _ in range(DRAIN_FRAMES):
            if budget <= 0:
                break
            try:
                parts = self.sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            budget -= sum(len(p) for p in parts)
            peer = parts[0].bytes
            if len(parts) != 2:
                out.append((peer, b"", None))
                continue
            data = parts[1].bytes
            identity = None
            if self.enrolled is not None:
                # ZAP's User-Id is the connection's key; its host is looked up now.
                identity = self.enrolled.host_for(str(parts[1].get("User-Id")).encode()) or ""
            out.append((peer, data, self.core.ingest.prepare(data, identity)))
        return out

    def _federate(self, fed: Federation) -> None:
        fed.receive(self._apply_forwarded)
        fed.pump(self.clock())

    def _apply_forwarded(self, frames: list[wire.Frame]) -> None:
        """Peers' forwards of jobs this aggregator owns: diagnosed as if from their hosts
        (nothing to store: the pod aggregator stored and acked the frames)."""
        with self.lock:
            now = self.clock()
            for frame in frames:
                try:
                    self.core.diagnosis.observe(frame, now)
                except Exception as exc:
                    self.core.ingest.internal_error("federation", exc, now)

    def _guarded(self, where: str, step: Callable[..., Any], *args: Any) -> Any:
        """Run a periodic step; a failure is counted and logged, and the loop goes on."""
        try:
            return step(*args)
        except Exception as exc:
            self.core.ingest.internal_error(where, exc, self.clock())
            return None

    def run(self) -> int:
        next_tick = self.clock() + TICK_S
        next_prune = self.clock() + PRUNE_S
        poller = zmq.Poller()
        poller.register(self.sock, zmq.POLLIN)
        for s in self.federation.sockets() if self.federation is not None else []:
            poller.register(s, zmq.POLLIN)
        self.notify.ready(f"ingest on {self.cfg.listen}, API on http://{self.cfg.api}")
        while not self.stop_event.is_set():
            self.notify.watchdog()  # the loop comes round every 0.2 s at most
            timeout = max(0.0, min(next_tick - self.clock(), 0.2))
            if poller.poll(int(timeout * 1000)):
                self._drain()
            if self.federation is not None:
                self._guarded("federation", self._federate, self.federation)
            now = self.clock()
            if now >= next_tick:
                with self.lock:
                    self._guarded("tick", self.core.ingest.tick, now)
                    to_hosts = self._guarded("planner", self._planner_frames, now)
                    # only queues: a worker sends
                    self._guarded("alerts", self.alerts.tick, now, self.core.diagnosis)
                    self._guarded("status", self._status)
                self._guarded("planner", self._send_to_hosts, to_hosts or [])
                next_tick = now + TICK_S
            if now >= next_prune:
                with self.lock:
                    self._guarded("prune", self.core.ingest.prune, now)
                next_prune = now + PRUNE_S
        self.close()
        return 0

    def _status(self) -> None:
        hosts = self.core.registry.hosts.values()
        silent = sum(1 for h in hosts if h.status != "up")
        self.notify.status(f"{len(hosts)} hosts ({silent} silent), "
                           f"{sum(self.core.ingest.accepted.values())} frames accepted")

    def close(self) -> None:
        self.notify.stopping()
        self.alerts.close()
        if hasattr(self.core.actions, "close"):
            self.core.actions.close()
        self.httpd.shutdown()
        self.httpd.server_close()
        self.sock.close(0)
        if self.federation is not None:
            self.federation.close()
        if self.zap is not None:
            self.zap.close()
        self.zctx.term()
        if self.checkpointer is not None:
            self.checkpointer.close()
        self.cluster_metrics.close()
        log.info("aggregator stopped")


def run(cfg: AggregatorConfig) -> int:
    server = Server(cfg)

    def _stop(signum: int, _frame: Any) -> None:
        log.info("signal %d: stopping", signum)
        server.stop_event.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    return server.run()

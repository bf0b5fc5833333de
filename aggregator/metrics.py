"""The aggregator's /metrics: the cluster view only it has (docs/operations.md).

Per host: `c4_host_up` and the age of its last frame; incidents by class and state; the
suspects of open incidents; actions by outcome; alert deliveries. Time series of each host's
counters belong to the agents' own exporters: the aggregator re-exports them only with
`metrics_host_counters = true`, and then only for hosts that are up, so a dead host's frozen
counters never read as a healthy host with rate() 0.
"""
from __future__ import annotations

import sqlite3
import threading
from typing import Any, Callable, Iterable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from c4.core.ibmetrics import port_counter_families

from .diagnosis.findings import CLASS_RANK

STATES = ("open", "mitigated", "resolved")
ACTIONS = ("alert", "drain", "restart")
# actions.py outcomes folded into a fixed set, so every series exists from the start
RESULTS = {"ok": "ok", "dry-run": "dry_run", "failed": "failed", "timeout": "failed",
           "error": "failed"}  # "skipped: ..." -> skipped


class ClusterMetrics:
    """prometheus_client custom collector, computed at scrape time. Hosts and open incidents
    are read under the aggregator lock; incidents and actions are counted (a scan of both
    tables) on a connection of its own, off the lock: in WAL mode the scan waits for no
    writer and no writer waits for it. A :memory: database has no second connection: there
    the counting runs on `db` under the lock."""

    def __init__(self, lock: threading.Lock, hosts: Callable[[], Iterable[Any]],
                 db: sqlite3.Connection, diagnosis: Any, clock: Callable[[], float], *,
                 db_path: str = ":memory:", host_counters: bool = False,
                 alerts: Any = None) -> None:
        self.lock = lock
        self.hosts = hosts
        self.db = db
        self.db_path = db_path
        self.diagnosis = diagnosis
        self.clock = clock
        self.host_counters = host_counters
        self.alerts = alerts
        self._own: sqlite3.Connection | None = None
        self._own_lock = threading.Lock()  # scrapes come on several HTTP threads

    def collect(self) -> Iterator[Metric]:
        counts = None if self.db_path == ":memory:" else self._counts_own()
        with self.lock:
            now = self.clock()
            hosts = list(self.hosts())
            open_incidents = (self.diagnosis.incidents("open") + self.diagnosis.incidents("mitigated")
                              if self.diagnosis is not None else [])
            if counts is None:
                counts = _counts(self.db)
            alerts = self.alerts.stats() if self.alerts is not None else {}
            unasked = self.diagnosis.measuring.unasked if self.diagnosis is not None else 0
        yield from _host_metrics(hosts, now)
        yield from _incident_metrics(counts[0], open_incidents)
        yield from _action_metrics(counts[1])
        yield from _alert_metrics(alerts)
        yield CounterMetricFamily(
            "c4_diagnosis_probe_unasked", "Measuring-probe rounds of a path finding's candidate "
            "link that no host this aggregator routes could measure (counted once a round)",
            value=unasked)
        if self.host_counters:
            yield from _rdma_metrics([h for h in hosts if h.status == "up"])

    def _counts_own(self) -> tuple[list[tuple[str, str, int]], list[tuple[str, str, int]]]:
        with self._own_lock:
            if self._own is None:
                self._own = sqlite3.connect(self.db_path, isolation_level=None,
                                            check_same_thread=False)
                self._own.execute("PRAGMA query_only=1")
            return _counts(self._own)

    def close(self) -> None:
        with self._own_lock:
            if self._own is not None:
                self._own.close()
                self._own = None


def _counts(db: sqlite3.Connection) -> tuple[list[tuple[str, str, int]],
                                             list[tuple[str, str, int]]]:
    """(class, state, n) of incidents and (action, outcome, n) of actions."""
    out = []
    for sql in ("SELECT class, state, COUNT(*) FROM incidents GROUP BY 1, 2",
                "SELECT action, outcome, COUNT(*) FROM actions GROUP BY 1, 2"):
        try:
            out.append(list(db.execute(sql)))
        except sqlite3.OperationalError:  # table not created yet (no diagnosis / no actions)
            out.append([])
    return out[0], out[1]


def _host_metrics(hosts: list[Any], now: float) -> Iterator[Metric]:
    up = GaugeMetricFamily("c4_host_up", "1 while the host's agent reports, 0 once silent",
                           labels=["host"])
    age = GaugeMetricFamily("c4_host_last_report_age_seconds",
                            "Seconds since the host's last frame (aggregator clock)",
                            labels=["host"])
    for h in sorted(hosts, key=lambda h: h.name):
        up.add_metric([h.name], 1.0 if h.status == "up" else 0.0)
        age.add_metric([h.name], max(0.0, now - h.last_seen) if h.last_seen else float("nan"))
    yield up
    yield age


def _incident_metrics(counts: list[tuple[str, str, int]],
                      open_incidents: list[dict[str, Any]]) -> Iterator[Metric]:
    g = GaugeMetricFamily("c4_incidents", "Incidents by class and state (all stored)",
                          labels=["class", "state"])
    by = {(c, s): 0 for c in CLASS_RANK for s in STATES}
    for cls, state, n in counts:
        by[(cls, state)] = by.get((cls, state), 0) + n
    for (cls, state), n in sorted(by.items()):
        g.add_metric([cls, state], n)
    yield g
    s = GaugeMetricFamily("c4_incident_suspect_confidence",
                          "Confidence in each suspect of an open or mitigated incident (0..1)",
                          labels=["incident", "class", "kind", "suspect", "host"])
    for inc in open_incidents:
        for sus in inc.get("suspects", [])[:3]:  # the ranked top: bounded cardinality
            s.add_metric([str(inc["id"]), inc["class"], sus["kind"], sus["id"],
                          sus.get("host") or ""], sus["confidence"])
    yield s


def _action_metrics(counts: list[tuple[str, str, int]]) -> Iterator[Metric]:
    c = CounterMetricFamily("c4_actions", "Actions taken on incidents, by result (dry_run: "
                            "recorded, not executed)", labels=["action", "result"])
    by = {(a, r): 0 for a in ACTIONS for r in ("ok", "dry_run", "skipped", "failed")}
    for action, outcome, n in counts:
        key = (action, RESULTS.get(outcome, "skipped" if outcome.startswith("skipped") else "failed"))
        by[key] = by.get(key, 0) + n
    for (a, r), n in sorted(by.items()):
        c.add_metric([a, r], n)
    yield c


def _alert_metrics(stats: dict[str, dict[str, int]]) -> Iterator[Metric]:
    sent = CounterMetricFamily("c4_alert_notifications", "Alert notifications delivered",
                               labels=["receiver"])
    failed = CounterMetricFamily("c4_alert_notification_failures",
                                 "Alert notification attempts that failed (each retry counts)",
                                 labels=["receiver"])
    pending = GaugeMetricFamily("c4_alert_notifications_pending",
                                "Notifications waiting to be (re)tried", labels=["receiver"])
    for name, st in sorted(stats.items()):
        sent.add_metric([name], st["sent"])
        failed.add_metric([name], st["failed"])
        pending.add_metric([name], st["pending"])
    yield sent
    yield failed
    yield pending


def _rdma_metrics(hosts: list[Any]) -> Iterator[Metric]:
    """Up hosts' latest RDMA port counters, node_exporter's names plus a `host` label."""
    yield from port_counter_families(
        (([h.name, p["dev"], str(p["port"])], p.get("counters", {}))
         for h in hosts for p in (h.last_report.get("rdma") or {}).get("ports", [])),
        ["host", "device", "port"])


class FederationMetrics:
    """Forwarding between aggregators (federation.py): per peer what was forwarded, acked,
    dropped from a full queue (lost to the owner's diagnosis) and is still queued; what came
    in, was rejected (by reason) or lost by a peer. Read off the lock: counters only."""

    def __init__(self, federation: Any) -> None:
        self.federation = federation

    def collect(self) -> Iterator[Metric]:
        st = self.federation.stats()
        out = {k: CounterMetricFamily(f"c4_federation_{k}", doc, labels=["peer"]) for k, doc in (
            ("forwarded", "Frames queued for a peer aggregator (the owner of their jobs)"),
            ("acked", "Forwarded frames the peer acked (applied)"),
            ("dropped", "Forwarded frames dropped because the peer's queue was full"),
            ("resent", "Forwarded frames sent again after resend_after without an ack"))}
        queued = GaugeMetricFamily("c4_federation_queued_bytes",
                                   "Bytes of forward frames held for a peer", labels=["peer"])
        for peer, o in st["out"].items():
            for k, fam in out.items():
                fam.add_metric([peer], o[k])
            queued.add_metric([peer], o["queued_bytes"])
        yield from out.values()
        yield queued
        inn = st["in"]
        yield CounterMetricFamily("c4_federation_received", "Peers' forward frames applied",
                                  value=inn["received"])
        rej = CounterMetricFamily("c4_federation_rejected",
                                  "Peers' forward frames rejected, by reason", labels=["reason"])
        for reason, n in sorted(inn["rejected"].items()):
            rej.add_metric([reason], n)
        yield rej
        lost = CounterMetricFamily("c4_federation_lost", "Frames a peer dropped before they "
                                   "reached this aggregator (its floor)", labels=["peer"])
        for peer, n in sorted(inn["lost"].items()):
            lost.add_metric([peer], n)
        yield lost
        silent = GaugeMetricFamily("c4_federation_peer_silent_seconds",
                                   "Seconds since a peer's last forward (NaN: none since this "
                                   "aggregator started); its hosts' ranks stop with it",
                                   labels=["peer"])
        for peer, age in sorted(inn["silent_s"].items()):
            silent.add_metric([peer], float("nan") if age is None else age)
        yield silent

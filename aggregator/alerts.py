"""Alerts that open and resolve: Alertmanager v2, PagerDuty Events v2, Slack, generic webhook.

`Alerts.tick(now, diagnosis)` runs on the diagnosis tick (server.py), compares the open
incidents with what it last announced and calls `open`, `update`, `resend` or `resolve`; those
only queue. One worker thread delivers, so no HTTP call ever runs under the aggregator lock or
the socket loop. Per receiver and incident only the newest notification waits (a resolve is
never overtaken); a failed attempt is retried with exponential backoff (1 s doubling up to
`backoff_max_s`) until it succeeds, is superseded, or fails for good (an HTTP 4xx other than
408/429: the request itself is wrong). Attempts and failures are counted per receiver
(`/metrics`) and per incident (`c4 incident N`).

What each receiver gets (docs/operations.md#alerts):
- alertmanager: POST /api/v2/alerts with the incident's alert, re-sent every `resend_s` while
  open with endsAt = now + 4 x resend_s (as Prometheus does), endsAt = resolution time once
  resolved; when the labels change (the incident is localised, or changes class) the old label
  set is ended in the same request;
- pagerduty: Events v2 trigger on open and change, resolve on resolution, `dedup_key`
  `c4-<cluster>-incident-<id>`;
- slack: an incoming-webhook message on open and on resolution;
- webhook: Alertmanager's webhook document (version 4) on open, change and resolution, so a
  receiver written for Alertmanager takes c4's notifications as they are.
"""
from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any, Callable

from c4.core.config import ConfigError, field

from .diagnosis.findings import CLASS_RANK

RECEIVER_TYPES = ("alertmanager", "pagerduty", "slack", "webhook")
ALERTNAME = "C4Incident"
SEVERITY = {"hw_xid": "critical", "hw_nic_down": "critical", "comm_hang": "critical",
            "noncomm_hang": "critical", "host_silent": "critical", "hw_aer": "warning",
            "hw_link_flap": "warning", "hw_pfc_storm": "warning", "comm_slow": "warning",
            "noncomm_slow": "warning"}
PAGERDUTY_SEVERITY = {"critical": "critical", "warning": "warning"}
PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"
EVIDENCE_MAX = 2000  # characters of JSON evidence in an annotation
_RANK = {"open": 3, "update": 1, "resend": 0, "resolve": 4}  # what a pending notification keeps


@dataclass(frozen=True)
class Receiver:
    type: str = field("", "`alertmanager`, `pagerduty`, `slack` or `webhook`")
    url: str = field("", "alertmanager: its base URL (http://am:9093); pagerduty: the Events v2 "
                         "endpoint (default " + PAGERDUTY_URL + "); slack: the incoming-webhook "
                         "URL; webhook: the URL that receives the POST")
    name: str = field("", "name in metrics and `c4 incident N`; default: the type")
    routing_key: str = field("", "pagerduty: the integration's routing key (32 characters)")
    classes: list[str] = field(["*"], "incident classes sent to this receiver; \"*\": all")

    @property
    def label(self) -> str:
        return self.name or self.type

    def validate(self, where: str) -> None:
        if self.type not in RECEIVER_TYPES:
            raise ConfigError(f"{where}.type: {self.type!r} is not one of {', '.join(RECEIVER_TYPES)}")
        if self.type != "pagerduty" and not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"{where}.url: {self.type} needs an http:// or https:// URL")
        if self.type == "pagerduty" and not self.routing_key:
            raise ConfigError(f"{where}.routing_key: pagerduty needs the integration's routing key")
        for c in self.classes:
            if c != "*" and c not in CLASS_RANK:
                raise ConfigError(f"{where}.classes: unknown class {c!r}")


@dataclass
class AlertsConfig:
    cluster: str = field("", "the `cluster` label of every alert (tells clusters apart in one "
                             "Alertmanager)")
    external_url: str = field("", "the aggregator's URL as people reach it, for links in "
                                  "alerts (e.g. http://c4.example:9464); default: http://<api>")
    resend_s: float = field(60.0, "re-send open incidents to Alertmanager this often (seconds)")
    timeout_s: float = field(5.0, "time limit of one HTTP request (seconds)")
    backoff_max_s: float = field(60.0, "longest wait between retries of a failed notification")
    receivers: list[Receiver] = field([], "`[[alerts.receivers]]` tables: type, url, name, "
                                          "routing_key, classes")

    def validate(self, where: str) -> None:
        for key in ("resend_s", "timeout_s", "backoff_max_s"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"{where}.{key}: must be > 0")
        names = [r.label for r in self.receivers]
        if len(set(names)) != len(names):
            raise ConfigError(f"{where}.receivers: give receivers of one type distinct names")


class DeliveryError(Exception):
    def __init__(self, msg: str, retry: bool = True) -> None:
        super().__init__(msg)
        self.retry = retry


def iso(ts: float) -> str:
    return dt.datetime.fromtimestamp(ts, dt.timezone.utc).isoformat(timespec="milliseconds") \
        .replace("+00:00", "Z")


def alert_document(inc: dict[str, Any], cfg: AlertsConfig, now: float) -> dict[str, Any]:
    """The incident as one Alertmanager alert (labels, annotations, startsAt, endsAt)."""
    top = inc["suspects"][0] if inc.get("suspects") else {}
    severity = SEVERITY.get(inc["class"], "warning")
    labels = {"alertname": ALERTNAME, "incident": str(inc["id"]), "class": inc["class"],
              "severity": severity, "cluster": cfg.cluster, "job": inc.get("job") or "",
              "suspect_kind": top.get("kind", ""), "suspect": top.get("id", "")}
    url = f"{cfg.external_url.rstrip('/')}/ui#incident-{inc['id']}"
    suspects = ", ".join(f"{s['kind']} {s['id']} ({s['confidence']:.0%})"
                         for s in inc.get("suspects", [])[:3])
    evidence = json.dumps(inc.get("evidence") or {}, sort_keys=True, separators=(",", ":"))
    annotations = {"summary": inc.get("summary", ""), "suspects": suspects or "none yet",
                   "evidence": evidence[:EVIDENCE_MAX], "url": url}
    resolved = inc.get("state") == "resolved"
    ends = (inc.get("resolved") or now) if resolved else now + 4 * cfg.resend_s
    return {"labels": {k: v for k, v in labels.items() if v != ""}, "annotations": annotations,
            "startsAt": iso(inc["detected"]), "endsAt": iso(ends), "generatorURL": url,
            "status": "resolved" if resolved else "firing"}


class Sender:
    """One receiver: turns (event, alert) into its HTTP request."""

    def __init__(self, rcv: Receiver, cfg: AlertsConfig) -> None:
        self.rcv = rcv
        self.cfg = cfg
        self.last_labels: dict[int, dict[str, str]] = {}  # alertmanager: label set last sent

    def wants(self, event: str) -> bool:
        return {"alertmanager": True, "pagerduty": event != "resend",
                "slack": event in ("open", "resolve"),
                "webhook": event != "resend"}[self.rcv.type]

    def request(self, iid: int, event: str, alert: dict[str, Any]) -> tuple[str, Any]:
        t = self.rcv.type
        if t == "alertmanager":
            body = [{k: alert[k] for k in ("labels", "annotations", "startsAt", "endsAt",
                                           "generatorURL")}]
            old = self.last_labels.get(iid)
            if old is not None and old != alert["labels"]:  # end the stale identity
                body.append({"labels": old, "annotations": alert["annotations"],
                             "startsAt": alert["startsAt"], "endsAt": iso(time.time()),
                             "generatorURL": alert["generatorURL"]})
            return self.rcv.url.rstrip("/") + "/api/v2/alerts", body
        if t == "pagerduty":
            return self.rcv.url or PAGERDUTY_URL, pagerduty_event(iid, event, alert, self.rcv,
                                                                  self.cfg)
        if t == "slack":
            return self.rcv.url, slack_message(event, alert)
        return self.rcv.url, webhook_document(alert, self.rcv, self.cfg)

    def delivered(self, iid: int, event: str, alert: dict[str, Any]) -> None:
        if event == "resolve":
            self.last_labels.pop(iid, None)
        else:
            self.last_labels[iid] = alert["labels"]


def pagerduty_event(iid: int, event: str, alert: dict[str, Any], rcv: Receiver,
                    cfg: AlertsConfig) -> dict[str, Any]:
    """Events API v2 (developer.pagerduty.com/docs/events-api-v2/trigger-events)."""
    dedup = f"c4-{cfg.cluster or 'cluster'}-incident-{iid}"
    if event == "resolve":
        return {"routing_key": rcv.routing_key, "event_action": "resolve", "dedup_key": dedup}
    labels, ann = alert["labels"], alert["annotations"]
    return {
        "routing_key": rcv.routing_key, "event_action": "trigger", "dedup_key": dedup,
        "payload": {
            "summary": f"c4 incident {iid} {labels['class']}: {ann['summary']}"[:1024],
            "source": labels.get("suspect") or labels.get("cluster") or "c4",
            "severity": PAGERDUTY_SEVERITY[labels["severity"]],
            "timestamp": alert["startsAt"], "component": labels.get("suspect_kind", ""),
            "group": labels.get("job", ""), "class": labels["class"],
            "custom_details": {"suspects": ann["suspects"], "evidence": ann["evidence"],
                               "cluster": labels.get("cluster", "")},
        },
        "client": "c4", "client_url": ann["url"],
        "links": [{"href": ann["url"], "text": f"c4 incident {iid}"}],
    }


def slack_message(event: str, alert: dict[str, Any]) -> dict[str, Any]:
    """An incoming-webhook message: `text` (the notification fallback) plus blocks."""
    labels, ann = alert["labels"], alert["annotations"]
    head = ("RESOLVED" if event == "resolve" else labels["severity"].upper())
    text = (f"[{head}] c4 incident {labels['incident']} {labels['class']}"
            f"{' job ' + labels['job'] if labels.get('job') else ''}: {ann['summary']}")
    return {"text": text, "blocks": [
        {"type": "section", "text": {"type": "mrkdwn", "text": text[:3000]}},
        {"type": "context", "elements": [
            {"type": "mrkdwn", "text": f"suspects: {ann['suspects']} | <{ann['url']}|open in c4>"[:3000]}]},
    ]}


def webhook_document(alert: dict[str, Any], rcv: Receiver, cfg: AlertsConfig) -> dict[str, Any]:
    """Alertmanager's webhook_config payload (version 4) holding this one alert."""
    labels = alert["labels"]
    group = {"alertname": ALERTNAME, "incident": labels["incident"]}
    fp = hashlib.sha256(json.dumps(labels, sort_keys=True).encode()).hexdigest()[:16]
    return {"version": "4", "groupKey": json.dumps(group, sort_keys=True), "truncatedAlerts": 0,
            "status": alert["status"], "receiver": rcv.label, "groupLabels": group,
            "commonLabels": labels, "commonAnnotations": alert["annotations"],
            "externalURL": cfg.external_url,
            "alerts": [{"status": alert["status"], "labels": labels,
                        "annotations": alert["annotations"], "startsAt": alert["startsAt"],
                        "endsAt": alert["endsAt"], "generatorURL": alert["generatorURL"],
                        "fingerprint": fp}]}


@dataclass
class _Pending:
    event: str
    alert: dict[str, Any]
    due: float
    attempts: int = 0


class Alerts:
    """See the module docstring. `tick` and the query methods run on the caller's thread."""

    def __init__(self, cfg: AlertsConfig, log: logging.Logger,
                 clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.log = log
        self.clock = clock
        self.senders = [Sender(r, cfg) for r in cfg.receivers]
        self.announced: dict[int, tuple[str, float]] = {}  # incident -> (fingerprint, sent at)
        self._pending: dict[tuple[int, int], _Pending] = {}  # (sender index, incident) -> next
        self._stats = {s.rcv.label: {"sent": 0, "failed": 0} for s in self.senders}
        self._by_incident: dict[int, dict[str, dict[str, Any]]] = {}
        self._cv = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        if self.senders:
            self._thread = threading.Thread(target=self._loop, name="c4-alerts", daemon=True)
            self._thread.start()

    # -- the diagnosis tick -----------------------------------------------------------------
    def tick(self, now: float, diagnosis: Any) -> None:
        if not self.senders or diagnosis is None:
            return
        live = diagnosis.incidents("open") + diagnosis.incidents("mitigated")
        for inc in live:
            fp = _fingerprint(inc)
            seen = self.announced.get(inc["id"])
            if seen is None:
                self.open(inc, now)
            elif seen[0] != fp:
                self.update(inc, now)
            elif now - seen[1] >= self.cfg.resend_s:
                self.resend(inc, now)
        ids = {inc["id"] for inc in live}
        for iid in [i for i in self.announced if i not in ids]:
            inc = diagnosis.incident(iid)
            if inc is not None:
                self.resolve(dict(inc, state="resolved"), now)
            self.announced.pop(iid, None)

    def open(self, inc: dict[str, Any], now: float) -> None:
        self._queue("open", inc, now)

    def update(self, inc: dict[str, Any], now: float) -> None:
        self._queue("update", inc, now)

    def resend(self, inc: dict[str, Any], now: float) -> None:
        self._queue("resend", inc, now)

    def resolve(self, inc: dict[str, Any], now: float) -> None:
        self._queue("resolve", inc, now)

    def _queue(self, event: str, inc: dict[str, Any], now: float) -> None:
        if event != "resolve":
            self.announced[inc["id"]] = (_fingerprint(inc), now)
        alert = alert_document(inc, self.cfg, now)
        with self._cv:
            for i, s in enumerate(self.senders):
                if not s.wants(event) or not ("*" in s.rcv.classes or inc["class"] in s.rcv.classes):
                    continue
                key = (i, inc["id"])
                old = self._pending.get(key)
                kept = old.event if old is not None and _RANK[old.event] > _RANK[event] else event
                self._pending[key] = _Pending(kept, alert, self.clock(),
                                              old.attempts if old is not None else 0)
            self._cv.notify()

    # -- queries ----------------------------------------------------------------------------
    def stats(self) -> dict[str, dict[str, int]]:
        with self._cv:
            pending: dict[str, int] = {}
            for (i, _), _p in self._pending.items():
                pending[self.senders[i].rcv.label] = pending.get(self.senders[i].rcv.label, 0) + 1
            return {name: dict(st, pending=pending.get(name, 0)) for name, st in self._stats.items()}

    def status(self, iid: int) -> dict[str, dict[str, Any]]:
        """Per receiver: notifications sent and failed for this incident, the last error."""
        with self._cv:
            out = {k: dict(v) for k, v in self._by_incident.get(iid, {}).items()}
            for (i, pid), p in self._pending.items():
                if pid == iid:
                    out.setdefault(self.senders[i].rcv.label, _blank())["pending"] = p.event
            return out

    def close(self, timeout: float = 2.0) -> None:
        """Deliver what is due now (a resolve queued at shutdown still goes), then stop."""
        if self._thread is None:
            return
        with self._cv:
            self._stop = True
            self._cv.notify()
        self._thread.join(timeout)

    # -- the worker -------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self._cv:
                while True:
                    now = self.clock()
                    due = [(k, p) for k, p in self._pending.items() if p.due <= now]
                    if due or self._stop:
                        break
                    nxt = min((p.due for p in self._pending.values()), default=now + 3600)
                    self._cv.wait(max(0.01, nxt - now))
                if self._stop and not due:
                    return
                for k, _ in due:
                    del self._pending[k]
            for (i, iid), p in due:
                self._deliver(i, iid, p)
            if self._stop:
                return

    def _deliver(self, i: int, iid: int, p: _Pending) -> None:
        sender = self.senders[i]
        name = sender.rcv.label
        try:
            url, body = sender.request(iid, p.event, p.alert)
            _post(url, body, self.cfg.timeout_s)
        except DeliveryError as exc:
            self._failed(i, iid, p, name, exc)
            return
        sender.delivered(iid, p.event, p.alert)
        with self._cv:
            self._stats[name]["sent"] += 1
            st = self._by_incident.setdefault(iid, {}).setdefault(name, _blank())
            st["sent"] += 1
            st["last"] = p.event
            st["last_ok"] = self.clock()

    def _failed(self, i: int, iid: int, p: _Pending, name: str, exc: DeliveryError) -> None:
        with self._cv:
            self._stats[name]["failed"] += 1
            st = self._by_incident.setdefault(iid, {}).setdefault(name, _blank())
            st["failed"] += 1
            st["last_error"] = str(exc)[:300]
            key = (i, iid)
            if exc.retry and key not in self._pending and not self._stop:  # not superseded
                delay = min(self.cfg.backoff_max_s, 2.0 ** p.attempts)
                self._pending[key] = _Pending(p.event, p.alert, self.clock() + delay,
                                              p.attempts + 1)
        self.log.warning("alerts: %s %s of incident %d failed (attempt %d): %s", name, p.event,
                         iid, p.attempts + 1, exc)


def _blank() -> dict[str, Any]:
    return {"sent": 0, "failed": 0, "last": None, "last_ok": None, "last_error": None}


def _fingerprint(inc: dict[str, Any]) -> str:
    top = [(s["kind"], s["id"]) for s in inc.get("suspects", [])[:1]]
    # not the summary: its numbers move every evaluation, and each change re-notifies
    return json.dumps([inc["class"], inc.get("state"), top], sort_keys=True)


def _post(url: str, body: Any, timeout: float) -> None:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json",
                                          "User-Agent": "c4-aggregator"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            resp.read()
    except urllib.error.HTTPError as exc:
        detail = exc.read()[:200].decode("utf-8", "replace")
        raise DeliveryError(f"HTTP {exc.code}: {detail}",
                            retry=exc.code >= 500 or exc.code in (408, 429)) from None
    except (urllib.error.URLError, OSError) as exc:
        raise DeliveryError(f"cannot reach {url}: {getattr(exc, 'reason', exc)}") from None

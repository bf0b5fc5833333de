"""PagerDuty Events v2, Slack incoming-webhook and generic webhook senders against local
receivers that check the documented request schemas and answer as the services do; retries
with backoff, and failures counted per receiver and per incident."""
from __future__ import annotations

import datetime as dt
import logging
import re
from typing import Any, Iterator

import pytest

from c4.aggregator.alerts import Alerts, AlertsConfig, Receiver as Rcv
from c4.core.config import build

from .procs import wait_for
from .receivers import Receiver

ROUTING_KEY = "R0UT1NGKEY0123456789abcdefABCDEF"  # 32 characters, as PagerDuty issues them


def pagerduty_schema(body: Any) -> list[str]:
    """developer.pagerduty.com/docs/events-api-v2: enqueue request body."""
    errs = []
    if not isinstance(body, dict):
        return ["body is not a JSON object"]
    if body.get("routing_key") != ROUTING_KEY:
        errs.append("routing_key")
    if body.get("event_action") not in ("trigger", "acknowledge", "resolve"):
        errs.append("event_action")
    if not isinstance(body.get("dedup_key"), str) or not 0 < len(body["dedup_key"]) <= 255:
        errs.append("dedup_key")
    if body.get("event_action") == "trigger":
        p = body.get("payload") or {}
        if not isinstance(p.get("summary"), str) or not 0 < len(p["summary"]) <= 1024:
            errs.append("payload.summary")
        if not isinstance(p.get("source"), str) or not p["source"]:
            errs.append("payload.source")
        if p.get("severity") not in ("critical", "error", "warning", "info"):
            errs.append("payload.severity")
        try:
            dt.datetime.fromisoformat(p.get("timestamp", "").replace("Z", "+00:00"))
        except ValueError:
            errs.append("payload.timestamp")
        for link in body.get("links", []):
            if not {"href", "text"} <= set(link):
                errs.append("links")
    return errs


def pagerduty(body: Any) -> tuple[int, Any]:
    errs = pagerduty_schema(body)
    if errs:
        return 400, {"status": "invalid event", "message": "Event object is invalid",
                     "errors": errs}
    return 202, {"status": "success", "message": "Event processed",
                 "dedup_key": body["dedup_key"]}


def slack_schema(body: Any) -> list[str]:
    """api.slack.com/messaging/webhooks: `text`, and blocks of known types with text objects."""
    if not isinstance(body, dict) or not isinstance(body.get("text"), str) or not body["text"]:
        return ["text (the notification fallback) is required"]
    errs = []
    for b in body.get("blocks", []):
        if b.get("type") == "section":
            t = b.get("text", {})
            if t.get("type") not in ("mrkdwn", "plain_text") or not 0 < len(t.get("text", "")) <= 3000:
                errs.append("section.text")
        elif b.get("type") == "context":
            if not all(e.get("type") in ("mrkdwn", "plain_text", "image") for e in b.get("elements", [])):
                errs.append("context.elements")
        else:
            errs.append(f"block type {b.get('type')!r}")
    return errs


def slack(body: Any) -> tuple[int, Any]:
    return (400, "invalid_blocks") if slack_schema(body) else (200, "ok")


class Diagnosis:
    """The two queries Alerts makes of diagnosis, over a dict of incidents."""

    def __init__(self) -> None:
        self.incs: dict[int, dict[str, Any]] = {}

    def incidents(self, state: str | None = None) -> list[dict[str, Any]]:
        return [i for i in self.incs.values() if state is None or i["state"] == state]

    def incident(self, iid: int) -> dict[str, Any] | None:
        return self.incs.get(iid)


def incident(iid: int, **kw: Any) -> dict[str, Any]:
    inc = {"id": iid, "class": "comm_hang", "state": "open", "job": "train-7",
           "summary": "rank 5 stopped at collective 1200", "detected": 1000.0,
           "resolved": None, "evidence": {"seq_behind": 3},
           "suspects": [{"kind": "host", "id": "gpu-17", "host": "gpu-17", "confidence": 0.93}]}
    inc.update(kw)
    return inc


@pytest.fixture
def receivers() -> Iterator[dict[str, Receiver]]:
    rs = {"pd": Receiver(pagerduty), "slack": Receiver(slack), "hook": Receiver()}
    yield rs
    for r in rs.values():
        r.close()


def make(receivers: list[dict[str, Any]], **kw: Any) -> Alerts:
    cfg = build(AlertsConfig, {"cluster": "prod-a", "external_url": "http://c4.example:9464",
                               "resend_s": 0.2, **kw, "receivers": receivers}, "alerts")
    return Alerts(cfg, logging.getLogger("test.alerts"))


def test_pagerduty_slack_webhook_open_and_resolve(receivers: dict[str, Receiver]) -> None:
    diag = Diagnosis()
    alerts = make([{"type": "pagerduty", "url": receivers["pd"].url, "routing_key": ROUTING_KEY},
                   {"type": "slack", "url": receivers["slack"].url},
                   {"type": "webhook", "url": receivers["hook"].url}])
    try:
        diag.incs[4] = incident(4)
        for now in (1.0, 1.3, 1.6):  # three ticks: open, then re-sends (not for these three)
            alerts.tick(now, diag)
        wait_for(lambda: all(r.bodies() for r in receivers.values()), what="the three opens")
        diag.incs[4] = incident(4, state="resolved", resolved=1100.0)
        alerts.tick(2.0, diag)
        wait_for(lambda: len(receivers["pd"].bodies()) == 2 and len(receivers["slack"].bodies()) == 2
                 and len(receivers["hook"].bodies()) == 2, what="the resolves")
    finally:
        alerts.close()
    trigger, resolve = receivers["pd"].bodies()
    assert trigger["event_action"] == "trigger" and resolve["event_action"] == "resolve"
    assert trigger["dedup_key"] == resolve["dedup_key"] == "c4-prod-a-incident-4"
    assert trigger["payload"]["severity"] == "critical" and trigger["payload"]["source"] == "gpu-17"
    assert trigger["links"][0]["href"] == "http://c4.example:9464/ui#incident-4"
    opened, closed = receivers["slack"].bodies()
    assert opened["text"].startswith("[CRITICAL] c4 incident 4 comm_hang job train-7")
    assert closed["text"].startswith("[RESOLVED]")
    fired, ended = receivers["hook"].bodies()  # Alertmanager's webhook document
    assert fired["version"] == "4" and fired["status"] == "firing"
    assert ended["status"] == "resolved" and ended["alerts"][0]["labels"] == fired["alerts"][0]["labels"]
    assert fired["alerts"][0]["labels"]["suspect"] == "gpu-17"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", ended["alerts"][0]["endsAt"])
    assert alerts.status(4)["pagerduty"]["sent"] == 2 and alerts.stats()["slack"]["failed"] == 0


def test_failures_are_retried_with_backoff_counted_and_shown(receivers: dict[str, Receiver]) -> None:
    answers = iter([(503, "busy"), (429, "slow down")])
    flaky = Receiver(lambda body: next(answers, None) or pagerduty(body))
    diag = Diagnosis()
    alerts = make([{"type": "pagerduty", "url": flaky.url, "routing_key": ROUTING_KEY}])
    try:
        diag.incs[9] = incident(9)
        alerts.tick(1.0, diag)
        wait_for(lambda: alerts.status(9).get("pagerduty", {}).get("sent") == 1, timeout=10,
                 what="delivery after two failures (1 s, then 2 s backoff)")
    finally:
        alerts.close()
        flaky.close()
    st = alerts.status(9)["pagerduty"]
    assert st["failed"] == 2 and "429" in st["last_error"]
    assert len(flaky.bodies()) == 3 and alerts.stats()["pagerduty"]["failed"] == 2


def test_a_rejected_request_is_not_retried(receivers: dict[str, Receiver]) -> None:
    diag = Diagnosis()
    alerts = make([{"type": "pagerduty", "url": receivers["pd"].url,
                    "routing_key": "wrong-key"}])  # the receiver answers 400
    try:
        diag.incs[2] = incident(2)
        alerts.tick(1.0, diag)
        wait_for(lambda: alerts.status(2).get("pagerduty", {}).get("failed") == 1,
                 what="the 400")
    finally:
        alerts.close()
    assert "routing_key" in alerts.status(2)["pagerduty"]["last_error"]
    assert alerts.stats()["pagerduty"]["pending"] == 0 and len(receivers["pd"].bodies()) == 1


def test_config_errors_name_the_key() -> None:
    from c4.core.config import ConfigError

    with pytest.raises(ConfigError, match="routing_key"):
        build(AlertsConfig, {"receivers": [{"type": "pagerduty"}]}, "alerts")
    with pytest.raises(ConfigError, match="type"):
        build(AlertsConfig, {"receivers": [{"type": "email", "url": "http://x"}]}, "alerts")
    assert Rcv(type="slack", url="http://x").label == "slack"

"""A real Alertmanager (Debian prometheus-alertmanager) on loopback between the aggregator and
a webhook receiver: an incident opened in a replayed recording arrives once, grouped, however
often c4 re-sends it, and resolves when the incident does."""
from __future__ import annotations

import json
import re
import shutil
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import pytest

from .feed import feeding, simulate
from .procs import Cluster, Proc, free_port, wait_for
from .receivers import Receiver

SLOW = "node002"
SPEED = 2.0  # simulated seconds per real second (C4D counts evaluations in real seconds)


def alertmanager_bin() -> str:
    exe = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
    if exe is None:
        pytest.skip("Alertmanager not installed (Debian prometheus-alertmanager; scripts/setup.sh)")
    return exe


@pytest.fixture
def recording(tmp_path: Path) -> Path:
    return simulate(tmp_path / "slow.c4rec", f"slow-node:{SLOW}@5-25", 40)


@pytest.fixture
def webhook() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def alertmanager(tmp_path: Path, webhook: Receiver) -> Iterator[str]:
    port = free_port()
    cfg = tmp_path / "alertmanager.yml"
    cfg.write_text(json.dumps({  # YAML is a superset of JSON
        "route": {"receiver": "test", "group_by": ["alertname", "cluster"], "group_wait": "1s",
                  "group_interval": "1s", "repeat_interval": "1h"},
        "receivers": [{"name": "test", "webhook_configs": [
            {"url": webhook.url + "/hook", "send_resolved": True}]}],
    }))
    p = Proc([alertmanager_bin(), f"--config.file={cfg}", f"--storage.path={tmp_path / 'am'}",
              f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="],
             tmp_path / "alertmanager.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: urllib.request.urlopen(url + "/-/ready", timeout=2).status == 200,
                 what="Alertmanager ready")
        yield url
    finally:
        p.stop()


def notified(webhook: Receiver, status: str) -> list[dict]:
    """Alerts of incident 1 in the webhook notifications, with the given status."""
    return [a for b in webhook.bodies() for a in b["alerts"]
            if a["labels"].get("incident") == "1" and a["status"] == status]


def test_incident_fires_once_grouped_and_resolves(cluster: Cluster, recording: Path,
                                                  alertmanager: str, webhook: Receiver) -> None:
    cluster.start_aggregator(
        f'topology = "{recording}.topology.json"\n'
        "[diagnosis]\nresolve_hold_s = 5.0\n"
        f'[alerts]\ncluster = "lab"\nresend_s = 1.0\n'
        f'[[alerts.receivers]]\ntype = "alertmanager"\nurl = "{alertmanager}"\n')
    feeder, stop = feeding(cluster, recording, SPEED)
    try:
        firing = wait_for(lambda: notified(webhook, "firing"), timeout=30,
                          what="the incident's alert at the webhook")
        labels = firing[-1]["labels"]
        assert labels["alertname"] == "C4Incident" and labels["class"] == "comm_slow"
        assert labels["cluster"] == "lab" and labels["severity"] == "warning"
        assert labels["suspect_kind"] == "host" and labels["suspect"] == SLOW
        assert labels["job"].startswith("train")
        ann = firing[-1]["annotations"]
        assert SLOW in ann["suspects"] and ann["url"].endswith("/ui#incident-1")
        assert json.loads(ann["evidence"])  # the numbers, as JSON
        group = webhook.bodies()[-1]
        assert group["groupLabels"] == {"alertname": "C4Incident", "cluster": "lab"}

        # Re-sent every second while open, yet one alert in Alertmanager and one notification.
        time.sleep(3)
        with urllib.request.urlopen(alertmanager + "/api/v2/alerts", timeout=5) as r:
            am = [a for a in json.loads(r.read()) if a["labels"].get("incident") == "1"]
        assert len(am) == 1 and am[0]["status"]["state"] == "active"
        inc = cluster.api("/api/v1/incidents/1")
        assert inc["alerts"]["alertmanager"]["sent"] >= 3  # re-sent ...
        assert inc["alerts"]["alertmanager"]["failed"] == 0
        assert len(notified(webhook, "firing")) == 1  # ... and deduplicated
        shown = cluster.cli("incident", "1")  # deliveries, as operators see them
        assert shown.returncode == 0 and "alert notifications" in shown.stdout
        row = [line for line in shown.stdout.splitlines() if "alertmanager" in line][0]
        cells = [c.strip() for c in re.split(r"[│|]", row) if c.strip()]
        assert cells[:3] == ["alertmanager", cells[1], "0"] and int(cells[1]) >= 3, row

        resolved = wait_for(lambda: notified(webhook, "resolved"), timeout=30,
                            what="the resolved notification")
        assert cluster.api("/api/v1/incidents/1")["state"] == "resolved"
        assert resolved[0]["labels"] == labels
    finally:
        stop.set()
        feeder.join(10)

"""`c4 incidents` / `c4 incident ID` against a live aggregator that diagnosed a real fault.

The fault comes from `c4 sim` (a slow node); its frames go to the aggregator's ingest socket as
agents send them, C4D opens an incident, the dry-run drain is recorded, and the CLI (a real
process) shows it all, in JSON and for people.
"""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Iterator

import pytest


from .feed import feeding, simulate
from .procs import REPO, Cluster, c4_cmd, env, free_port, wait_for

SLOW = "node002"
SPEED = 4.0  # simulated seconds per real second


@pytest.fixture
def recording(tmp_path: Path) -> Path:
    # No clock skew: frames are paced by their timestamps (C4D itself does not need this).
    return simulate(tmp_path / "slow.c4rec", f"slow-node:{SLOW}@5", 80)


@pytest.fixture
def live(cluster: Cluster, recording: Path) -> Iterator[Cluster]:
    """An aggregator receiving the slow-node cluster's frames until the test ends."""
    cluster.start_aggregator(extra=f'topology = "{recording}.topology.json"\n')
    feeder, stop = feeding(cluster, recording, SPEED)
    try:
        yield cluster
    finally:
        stop.set()
        feeder.join(30)


def _drained(cluster: Cluster) -> dict | None:
    for inc in cluster.api("/api/v1/incidents")["incidents"]:
        if inc["class"] == "comm_slow" and any(a["action"] == "drain" for a in inc["actions"]):
            return inc
    return None


def test_incident_cli_shows_a_diagnosed_fault(live: Cluster) -> None:
    inc = wait_for(lambda: _drained(live), timeout=40, what="a localised comm_slow incident")
    iid = inc["id"]
    assert inc["suspects"][0]["host"] == SLOW

    listed = live.cli("incidents", "--json")
    assert listed.returncode == 0, listed.stderr
    assert iid in [i["id"] for i in json.loads(listed.stdout)["incidents"]]

    table = live.cli("incidents", "--state", "open")
    assert table.returncode == 0, table.stderr
    row = next(line for line in table.stdout.splitlines() if re.match(rf"\s*{iid}\s+open\s", line))
    assert "comm_slow" in row and f"host {SLOW} (" in row and "train-0" in row
    resolved = json.loads(live.cli("incidents", "--state", "resolved", "--json").stdout)
    assert iid not in [i["id"] for i in resolved["incidents"]]

    detail = live.cli("incident", str(iid))
    assert detail.returncode == 0, detail.stderr
    out = detail.stdout
    assert f"Incident {iid}  comm_slow" in out and "first symptom" in out and "localised" in out
    assert "\x1b[" not in out  # not a terminal: plain text
    assert f"would run: scontrol update NodeName={SLOW} State=DRAIN Reason=c4:comm_slow:{iid}" in out
    assert "latency matrix" in out and re.search(r"\[[.:o#]\]", out)  # the focus cell

    as_json = json.loads(live.cli("incident", str(iid), "--json").stdout)
    assert as_json["id"] == iid
    (drain,) = [a for a in as_json["actions"] if a["action"] == "drain"]
    assert (drain["target"], drain["outcome"], drain["dry_run"]) == (SLOW, "dry-run", True)


def test_incident_cli_errors_are_clear(cluster: Cluster) -> None:
    cluster.start_aggregator()
    missing = cluster.cli("incident", "999999")
    assert missing.returncode == 1 and "no incident 999999" in missing.stderr
    nobody = subprocess.run(c4_cmd("incidents", "--aggregator", f"http://127.0.0.1:{free_port()}"),
                            capture_output=True, text=True, env=env(), cwd=REPO, timeout=60)
    assert nobody.returncode == 1
    assert "cannot reach the aggregator" in nobody.stderr and "c4 aggregator run" in nobody.stderr

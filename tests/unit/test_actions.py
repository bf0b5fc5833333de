"""C4D actions: policy, dry-run, guard rails, and the real backends driven through fake
`scontrol` / `kubectl` executables on PATH and a real HTTP server on loopback."""
from __future__ import annotations

import copy
import http.server
import json
import logging
import sqlite3
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from c4.aggregator.actions import ActionRunner, ActionsConfig, parse_node_state
from c4.core.config import ConfigError, build

NOW = 1718000031.25

# A stand-in for a cluster tool: appends its argv (JSON, one call per line) to calls.jsonl
# next to itself; `show` prints node_state.txt; FAKE_FAIL / FAKE_SLEEP files alter behaviour.
FAKE = """#!{python}
import json, os, sys, time
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "calls.jsonl"), "a") as f:
    f.write(json.dumps([os.path.basename(sys.argv[0])] + sys.argv[1:]) + "\\n")
if len(sys.argv) > 1 and sys.argv[1] == "show":
    p = os.path.join(here, "node_state.txt")
    print(open(p).read() if os.path.exists(p) else "NodeName=%s State=IDLE ThreadsPerCore=2" % sys.argv[3])
    sys.exit(0)
if os.path.exists(os.path.join(here, "FAKE_SLEEP")):
    time.sleep(30)
if os.path.exists(os.path.join(here, "FAKE_FAIL")):
    sys.stderr.write("slurm_update error: Invalid node name specified\\n")
    sys.exit(1)
"""


@pytest.fixture
def bindir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "bin"
    d.mkdir()
    for name in ("scontrol", "kubectl", "drain-hook"):
        p = d / name
        p.write_text(FAKE.format(python=sys.executable))
        p.chmod(0o755)
    monkeypatch.setenv("PATH", f"{d}:/usr/bin:/bin")
    return d


def calls(bindir: Path) -> list[list[str]]:
    p = bindir / "calls.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


@pytest.fixture
def incident(fixtures: Path) -> dict[str, Any]:
    return json.loads((fixtures / "incidents" / "noncomm_hang_42.json").read_text())


def other(incident: dict[str, Any], iid: int, host: str) -> dict[str, Any]:
    inc = copy.deepcopy(incident)
    inc["id"] = iid
    inc["suspects"][0]["host"] = host
    return inc


def runner(db: sqlite3.Connection | None = None, **table: Any) -> ActionRunner:
    cfg = build(ActionsConfig, table, "actions")
    return ActionRunner(cfg, db or sqlite3.connect(":memory:"), logging.getLogger("test.actions"),
                        clock=lambda: NOW)


def by_action(recs: list[dict[str, Any]], action: str) -> list[dict[str, Any]]:
    return [r for r in recs if r["action"] == action]


def test_default_policy_is_dry_run_and_executes_nothing(bindir: Path, incident: dict[str, Any],
                                                         caplog: pytest.LogCaptureFixture) -> None:
    r = runner()
    with caplog.at_level(logging.WARNING, logger="test.actions"):
        recs = r.on_incident(incident, NOW)
    assert calls(bindir) == []
    (drain,) = by_action(recs, "drain")
    assert drain["outcome"] == "dry-run" and drain["dry_run"] is True
    assert drain["target"] == "gpu-07"  # the 4% host suspect is below min_confidence 0.9
    assert drain["command"] == "scontrol update NodeName=gpu-07 State=DRAIN Reason=c4:noncomm_hang:42"
    assert "would run: scontrol update NodeName=gpu-07" in caplog.text
    (alert,) = by_action(recs, "alert")
    assert alert["outcome"] == "ok" and "rank 17" in caplog.text
    assert r.records(42) == sorted(recs, key=lambda x: x["id"])


def test_slurm_drain_runs_the_exact_command(bindir: Path, incident: dict[str, Any]) -> None:
    recs = runner(dry_run=False).on_incident(incident, NOW)
    (drain,) = by_action(recs, "drain")
    assert drain["outcome"] == "ok" and drain["exit_code"] == 0 and drain["dry_run"] is False
    assert calls(bindir) == [
        ["scontrol", "show", "node", "gpu-07"],
        ["scontrol", "update", "NodeName=gpu-07", "State=DRAIN", "Reason=c4:noncomm_hang:42"],
    ]
    assert " ".join(calls(bindir)[1]) == "scontrol update NodeName=gpu-07 State=DRAIN Reason=c4:noncomm_hang:42"


def test_rate_limit_counts_drains_in_the_window(bindir: Path, incident: dict[str, Any]) -> None:
    r = runner(dry_run=False, max_drains=2, window_s=600.0)
    outcomes = [by_action(r.on_incident(other(incident, i, f"gpu-{i:02d}"), NOW + i), "drain")[0]["outcome"]
                for i in (1, 2, 3)]
    assert outcomes == ["ok", "ok", "skipped: rate limit"]
    assert [c[2] for c in calls(bindir) if c[1] == "update"] == ["NodeName=gpu-01", "NodeName=gpu-02"]
    # Once the first drains leave the window, draining resumes.
    late = by_action(r.on_incident(other(incident, 4, "gpu-04"), NOW + 601.5), "drain")[0]
    assert late["outcome"] == "ok"


def test_rate_limit_applies_in_dry_run(bindir: Path, incident: dict[str, Any]) -> None:
    r = runner(max_drains=1)
    first = by_action(r.on_incident(other(incident, 1, "gpu-01"), NOW), "drain")[0]
    second = by_action(r.on_incident(other(incident, 2, "gpu-02"), NOW), "drain")[0]
    assert (first["outcome"], second["outcome"]) == ("dry-run", "skipped: rate limit")
    assert "max_drains = 1" in second["detail"]
    assert calls(bindir) == []


def test_node_drained_by_a_human_is_left_alone(bindir: Path, incident: dict[str, Any]) -> None:
    (bindir / "node_state.txt").write_text(
        "NodeName=gpu-07 Arch=x86_64 CoresPerSocket=32\n"
        "   State=IDLE+DRAIN ThreadsPerCore=2 TmpDisk=0 Weights=1\n"
        "   Reason=replace PSU [ops@2024-06-10T08:00:00]\n")
    r = runner(dry_run=False)
    (drain,) = by_action(r.on_incident(incident, NOW), "drain")
    assert drain["outcome"] == "skipped: drained by a human"
    assert "Reason=replace PSU" in drain["detail"]
    assert [c[1] for c in calls(bindir)] == ["show"]
    # A skipped drain does not use up the rate limit.
    assert r._drains_since(0.0) == 0


def test_node_drained_by_c4_may_be_drained_again(bindir: Path, incident: dict[str, Any]) -> None:
    (bindir / "node_state.txt").write_text("NodeName=gpu-07\n   State=DOWN+DRAIN\n   Reason=c4:hw_xid:9 [slurm@x]\n")
    (drain,) = by_action(runner(dry_run=False).on_incident(incident, NOW), "drain")
    assert drain["outcome"] == "ok"
    assert [c[1] for c in calls(bindir)] == ["show", "update"]


def test_same_incident_action_target_acts_once(bindir: Path, incident: dict[str, Any]) -> None:
    db = sqlite3.connect(":memory:")
    r = runner(db, dry_run=False)
    assert len(r.on_incident(incident, NOW)) == 2
    assert r.on_incident(incident, NOW + 5) == []
    # Also across an aggregator restart: the record, not memory, is the key.
    assert runner(db, dry_run=False).on_incident(incident, NOW + 10) == []
    assert [c[1] for c in calls(bindir)] == ["show", "update"]
    # A new suspect on the same incident is a new target.
    incident["suspects"].append({"kind": "host", "id": "gpu-09", "host": "gpu-09", "rank": None, "confidence": 0.92})
    (drain,) = r.on_incident(incident, NOW + 20)
    assert (drain["action"], drain["target"], drain["outcome"]) == ("drain", "gpu-09", "ok")


def test_failed_and_timed_out_commands_are_recorded(bindir: Path, incident: dict[str, Any]) -> None:
    (bindir / "FAKE_FAIL").touch()
    (drain,) = by_action(runner(dry_run=False).on_incident(incident, NOW), "drain")
    assert (drain["outcome"], drain["exit_code"]) == ("failed", 1)
    assert "Invalid node name" in drain["stderr"]
    (bindir / "FAKE_SLEEP").touch()
    (drain,) = by_action(runner(dry_run=False, timeout_s=0.5).on_incident(incident, NOW), "drain")
    assert drain["outcome"] == "timeout"
    assert drain["exit_code"] is None


def test_missing_binary_is_an_error_not_a_crash(tmp_path: Path, incident: dict[str, Any]) -> None:
    (drain,) = by_action(runner(dry_run=False, scontrol=str(tmp_path / "nope")).on_incident(incident, NOW), "drain")
    assert drain["outcome"] == "error" and "not found" in drain["detail"]


def test_kubernetes_cordons_then_taints(bindir: Path, incident: dict[str, Any]) -> None:
    (drain,) = by_action(runner(dry_run=False, drain_backend="kubernetes").on_incident(incident, NOW), "drain")
    assert drain["outcome"] == "ok" and drain["backend"] == "kubernetes"
    assert calls(bindir) == [
        ["kubectl", "cordon", "gpu-07"],
        ["kubectl", "taint", "nodes", "gpu-07", "c4.io/fault=noncomm_hang:NoSchedule", "--overwrite"],
    ]


def test_exec_hook_fills_placeholders(bindir: Path, incident: dict[str, Any]) -> None:
    r = runner(dry_run=False, drain_backend="exec",
               drain_command=["drain-hook", "--node={host}", "{class}", "{incident}", "{job}"])
    (drain,) = by_action(r.on_incident(incident, NOW), "drain")
    assert drain["outcome"] == "ok"
    assert calls(bindir) == [["drain-hook", "--node=gpu-07", "noncomm_hang", "42", "llm-train-7b"]]


def test_link_suspects_are_never_drained(bindir: Path, fixtures: Path) -> None:
    inc = json.loads((fixtures / "incidents" / "comm_slow_7.json").read_text())
    inc["state"] = "open"
    inc["suspects"][0]["confidence"] = 0.99  # a fabric link, however sure
    recs = runner(dry_run=False).on_incident(inc, NOW)
    assert by_action(recs, "drain") == [] and calls(bindir) == []


class _Hook(http.server.BaseHTTPRequestHandler):
    received: list[dict[str, Any]] = []
    status = 200

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).received.append({"path": self.path, "type": self.headers["Content-Type"], "body": json.loads(body)})
        self.send_response(self.status)
        self.end_headers()
        self.wfile.write(b"restart failed: scheduler busy" if self.status >= 400 else b"{}")

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hook_server() -> Iterator[tuple[str, type[_Hook]]]:
    handler = type("Hook", (_Hook,), {"received": [], "status": 200})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/restart", handler
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(5)


def test_restart_webhook_posts_the_incident(bindir: Path, incident: dict[str, Any],
                                            hook_server: tuple[str, type[_Hook]]) -> None:
    url, hook = hook_server
    r = runner(dry_run=False, restart_backend="webhook", restart_url=url,
               rules=[{"classes": ["noncomm_hang"], "min_confidence": 0.9, "actions": ["drain", "restart"]}])
    recs = r.on_incident(incident, NOW)
    assert [(x["action"], x["outcome"]) for x in recs] == [("drain", "ok"), ("restart", "ok")]
    assert recs[1]["target"] == "llm-train-7b" and recs[1]["command"] == f"POST {url}"
    (req,) = hook.received
    assert req["path"] == "/restart" and req["type"] == "application/json"
    assert req["body"]["incident"] == 42 and req["body"]["job"] == "llm-train-7b"
    assert req["body"]["exclude_hosts"] == ["gpu-07"]


def test_restart_webhook_error_is_recorded(incident: dict[str, Any], hook_server: tuple[str, type[_Hook]]) -> None:
    url, hook = hook_server
    hook.status = 503
    r = runner(dry_run=False, restart_backend="webhook", restart_url=url,
               rules=[{"classes": ["*"], "actions": ["restart"]}])
    (rec,) = r.on_incident(incident, NOW)
    assert rec["outcome"] == "failed" and "HTTP 503" in rec["detail"]
    assert "scheduler busy" in rec["stderr"]


def test_restart_dry_run_does_not_post(incident: dict[str, Any], hook_server: tuple[str, type[_Hook]]) -> None:
    url, hook = hook_server
    r = runner(restart_backend="webhook", restart_url=url, rules=[{"classes": ["*"], "actions": ["restart"]}])
    (rec,) = r.on_incident(incident, NOW)
    assert rec["outcome"] == "dry-run" and hook.received == []


def test_only_open_incidents_and_valid_ones_are_acted_on(bindir: Path, incident: dict[str, Any],
                                                         caplog: pytest.LogCaptureFixture) -> None:
    r = runner(dry_run=False)
    assert r.on_incident(dict(incident, state="resolved"), NOW) == []
    with caplog.at_level(logging.ERROR, logger="test.actions"):
        assert r.on_incident({"id": "x", "class": "comm_hang"}, NOW) == []
        assert r.on_incident(dict(incident, suspects=[{"kind": "host", "confidence": "high"}]), NOW) == []
    assert r.rejected == 2
    assert "suspects[0].confidence" in caplog.text
    assert calls(bindir) == [] and r.records() == []


@pytest.mark.parametrize("table, message", [
    ({"rules": [{"classes": ["comm_hnag"], "actions": ["alert"]}]}, "unknown class 'comm_hnag'"),
    ({"rules": [{"classes": ["*"], "actions": ["reboot"]}]}, "unknown action 'reboot'"),
    ({"rules": [{"classes": ["*"], "min_confidence": 1.5, "actions": ["alert"]}]}, "min_confidence"),
    ({"rules": [{"classes": ["*"], "actions": ["restart"]}]}, "restart_backend"),
    ({"drain_backend": "pbs"}, "drain_backend: 'pbs'"),
    ({"drain_backend": "exec"}, "drain_command"),
    ({"drain_backend": "exec", "drain_command": ["x", "{node}"]}, "unknown placeholder {node}"),
    ({"restart_backend": "webhook", "restart_url": "ftp://x"}, "restart_url"),
    ({"max_drains": -1}, "max_drains"),
    ({"timeout_s": 0}, "actions.timeout_s: must be > 0"),
    ({"dry-run": False}, "unknown key(s) dry-run"),
])
def test_bad_config_is_rejected_with_the_key(table: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as exc:
        build(ActionsConfig, table, "actions")
    assert message in str(exc.value) and str(exc.value).startswith("actions")


def test_parse_node_state() -> None:
    text = "NodeName=a\n   State=MIXED+DRAIN ThreadsPerCore=2\n   Reason=bad gpu 3 [root@2024-01-01T00:00:00]\n"
    assert parse_node_state(text) == ("MIXED+DRAIN", "bad gpu 3 [root@2024-01-01T00:00:00]")
    assert parse_node_state("NodeName=a State=IDLE") == ("IDLE", "")


# -- hostile values, restart storms, and the worker thread (issues 9 and 10) --------------------


def _restart_policy(**extra: Any) -> dict[str, Any]:
    return {"dry_run": False, "restart_backend": "exec", "restart_command": ["drain-hook", "restart", "{job}"],
            "rules": [{"classes": ["*"], "min_confidence": 0.0, "actions": ["restart"]}], **extra}


def test_restarts_are_rate_limited_per_job(bindir: Path, incident: dict[str, Any]) -> None:
    r = runner(**_restart_policy(max_restarts=1, window_s=600.0))
    outcomes = [r.on_incident(other(incident, i, "gpu-07"), NOW + i)[0]["outcome"] for i in range(1, 11)]
    assert outcomes == ["ok"] + ["skipped: rate limit"] * 9
    assert [c for c in calls(bindir) if c[1] == "restart"] == [["drain-hook", "restart", "llm-train-7b"]]
    other_job = other(incident, 20, "gpu-07")
    other_job["job"] = "llm-train-13b"
    assert r.on_incident(other_job, NOW + 20)[0]["outcome"] == "ok"


@pytest.mark.parametrize("job", ["--help", "a\nb", "a\x00b", "x y", "rm;-rf", "node[1-3]"])
def test_unsafe_job_names_never_reach_a_command(bindir: Path, incident: dict[str, Any], job: str) -> None:
    inc = dict(incident, job=job)
    (rec,) = runner(**_restart_policy()).on_incident(inc, NOW)
    assert rec["outcome"] == "refused: unsafe target" and "job" in rec["detail"]
    assert calls(bindir) == []


@pytest.mark.parametrize("host", ["ALL", "all", "gpu-[01-64]", "gpu-01,gpu-02", "-gpu"])
def test_slurm_never_gets_a_name_that_selects_other_nodes(bindir: Path, incident: dict[str, Any],
                                                          host: str) -> None:
    (drain,) = by_action(runner(dry_run=False).on_incident(other(incident, 5, host), NOW), "drain")
    assert drain["outcome"] == "refused: unsafe target"
    assert [c for c in calls(bindir) if c[1] == "update"] == []


def test_a_slurm_node_set_is_refused(bindir: Path, incident: dict[str, Any]) -> None:
    (bindir / "node_state.txt").write_text("NodeName=gpu-01 State=IDLE\n\nNodeName=gpu-02 State=IDLE\n")
    (drain,) = by_action(runner(dry_run=False).on_incident(incident, NOW), "drain")
    assert drain["outcome"] == "refused: unsafe target" and "several nodes" in drain["detail"]
    assert [c[1] for c in calls(bindir)] == ["show"]


def test_worker_runs_slow_actions_off_the_callers_thread(bindir: Path, incident: dict[str, Any],
                                                          tmp_path: Path) -> None:
    """A drain that takes 30 s must not hold up the caller (the ingest loop): submit returns at
    once, the record arrives later from results(), with its own SQLite connection."""
    from c4.aggregator.actions import ActionWorker

    (bindir / "FAKE_SLEEP").write_text("")
    cfg = build(ActionsConfig, {"dry_run": False, "timeout_s": 1.0}, "actions")
    w = ActionWorker(cfg, str(tmp_path / "c4.db"), logging.getLogger("test.actions"), clock=lambda: NOW)
    try:
        t0 = time.monotonic()
        for i in range(1, 4):
            w.submit(other(incident, i, f"gpu-0{i}"), NOW)
        assert time.monotonic() - t0 < 0.5, "submit waited for the command"
        assert w.results() == [] or all(r for _, r in w.results())
        done: dict[int, list[dict[str, Any]]] = {}
        deadline = time.monotonic() + 20
        while len(done) < 3 and time.monotonic() < deadline:
            done.update(w.results())
            time.sleep(0.05)
        assert sorted(done) == [1, 2, 3]
        drains = [by_action(done[i], "drain")[0]["outcome"] for i in (1, 2, 3)]
        assert drains == ["timeout", "timeout", "skipped: rate limit"]  # timeouts count
    finally:
        w.close()
    db = sqlite3.connect(tmp_path / "c4.db")
    assert db.execute("SELECT COUNT(*) FROM actions WHERE action = 'drain'").fetchone() == (3,)


def test_worker_queue_is_bounded(bindir: Path, incident: dict[str, Any], tmp_path: Path) -> None:
    from c4.aggregator.actions import ActionWorker

    (bindir / "FAKE_SLEEP").write_text("")
    cfg = build(ActionsConfig, {"dry_run": False, "timeout_s": 2.0}, "actions")
    w = ActionWorker(cfg, str(tmp_path / "c4.db"), logging.getLogger("test.actions"), maxsize=2)
    try:
        for i in range(1, 8):
            w.submit(other(incident, i, f"gpu-0{i}"), NOW)
        assert w.dropped >= 4  # one in progress, two queued, the rest dropped and counted
    finally:
        w.close(0.1)

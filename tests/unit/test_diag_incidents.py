"""incidents.py: findings -> deduplicated incidents in SQLite, localisation after persistence,
merging symptoms into their cause, hold-down resolution, actions on localisation."""
from __future__ import annotations

import logging
import sqlite3

import pytest

from c4.aggregator.actions import ActionRunner, ActionsConfig, Rule
from c4.aggregator.diagnosis.config import DiagnosisConfig
from c4.aggregator.diagnosis.findings import Finding, Suspect
from c4.aggregator.diagnosis.incidents import Incidents

LOG = logging.getLogger("test.diag")


def finding(cls="comm_slow", kind="host", sid="node003", conf=0.95, host="node003",
            comm="00000000000000aa", direct=False, hold=None, t=100.0):
    return Finding(cls, "job-1", comm, [Suspect(kind, sid, host, None, conf)],
                   f"{cls} at {sid}", {"n": 1}, t, direct=direct, hold_s=hold)


@pytest.fixture
def db():
    conn = sqlite3.connect(":memory:")
    yield conn
    conn.close()


def make(db, actions=None, **cfg):
    return Incidents(db, DiagnosisConfig(**cfg), actions, LOG)


def test_repeated_findings_are_one_incident_localised_after_persistence(db):
    inc = make(db, localise_persist=3)
    for i in range(3):
        got = inc.report(finding(), 100.0 + i)
        assert (got.localised is None) == (i < 2)
    assert len(inc.query(None)) == 1
    d = inc.get(got.id)
    assert d["localised"] == 102.0 and d["detected"] == 100.0 and d["first_symptom"] == 100.0
    assert d["suspects"][0] == {"kind": "host", "id": "node003", "host": "node003",
                                "rank": None, "confidence": 0.95}


def test_an_unconfident_suspect_is_never_localised(db):
    inc = make(db)
    for i in range(5):
        got = inc.report(finding(conf=0.5), 100.0 + i)
    assert got.localised is None


def test_unlocalised_symptom_adopts_its_culprit_when_it_becomes_clear(db):
    inc = make(db, localise_persist=1)
    vague = inc.report(finding(conf=0.4, kind="link", sid="leaf00-spine01", host=None), 100)
    clear = inc.report(finding(conf=0.97, kind="link", sid="leaf02-spine01", host=None), 101)
    assert clear.id == vague.id and clear.localised == 101
    # a later vague symptom in the same job is another fault, not this localised one
    other = inc.report(finding(conf=0.4, kind="nic", sid="node009/mlx5_1", host="node009"), 102)
    assert other.id != clear.id


def test_a_path_that_ends_at_a_named_host_or_nic_is_that_fault(db):
    """A slow host's connections can leave a pair that no single component explains (named as
    their path, not localised); the path ends at the host already named: one incident per
    fault (the quick corpus opened a second one). A path between other hosts is another."""
    inc = make(db, localise_persist=1)
    node = inc.report(finding(sid="node001", host="node001"), 100)
    path = inc.report(finding(conf=0.31, kind="path", sid="node000->node001", host=None), 101)
    assert path.id == node.id and len(inc.open()) == 1
    nic = inc.report(finding(kind="nic", sid="node005/mlx5_1", host="node005"), 102)
    path = inc.report(finding(conf=0.3, kind="path", sid="node005/mlx5_1->node004/mlx5_1",
                              host=None), 103)
    assert path.id == nic.id and len(inc.open()) == 2
    other = inc.report(finding(conf=0.31, kind="path", sid="node002/mlx5_0->node003/mlx5_0",
                               host=None), 104)
    assert other.id not in (node.id, nic.id)


def test_two_components_in_one_comm_are_two_incidents(db):
    inc = make(db)
    a = inc.report(finding(sid="node003", host="node003"), 100)
    b = inc.report(finding(kind="link", sid="leaf01-spine00", host=None), 100)
    assert a.id != b.id and len(inc.open()) == 2


def test_a_symptom_joins_the_incident_of_its_hardware_cause(db):
    inc = make(db)
    hw = inc.report(finding("hw_xid", "gpu", "node003/0000:18:00", host="node003", direct=True,
                            hold=300), 100)
    assert hw.localised == 100  # reported by the device: no persistence needed
    hang = inc.report(finding("noncomm_hang", "host", "node003", conf=0.9), 106)
    assert hang.id == hw.id and hang.cls == "hw_xid"
    assert hang.suspects[0]["kind"] == "gpu"
    assert "noncomm_hang" in hang.evidence["symptoms"]


def test_a_hardware_cause_found_later_takes_over_the_symptom(db):
    inc = make(db)
    hang = inc.report(finding("comm_hang", "nic", "node003/mlx5_2", conf=0.85), 100)
    hw = inc.report(finding("hw_nic_down", "nic", "node003/mlx5_2", conf=0.95, direct=True), 101)
    assert hw.id == hang.id and hw.cls == "hw_nic_down"
    assert hw.evidence["symptoms"] == {"comm_hang": "comm_hang at node003/mlx5_2"}
    assert len(inc.query(None)) == 1


def test_a_silent_host_with_its_ranks_missing_is_as_sure_as_the_hang(db):
    inc = make(db, localise_persist=1)
    silent = inc.report(finding("host_silent", conf=0.6, direct=True), 100)
    assert silent.localised is None
    merged = inc.report(finding("noncomm_hang", conf=0.9), 101)
    assert merged.id == silent.id and merged.cls == "host_silent"
    assert merged.suspects[0]["confidence"] == 0.9 and merged.localised == 101


def test_resolves_after_the_hold_down_and_a_recurrence_is_a_new_incident(db):
    inc = make(db, resolve_hold_s=30.0)
    first = inc.report(finding(), 100)
    inc.tick(120)
    assert inc.get(first.id)["state"] == "open"
    inc.tick(131)
    d = inc.get(first.id)
    assert d["state"] == "resolved" and d["resolved"] == 131
    again = inc.report(finding(), 140)
    assert again.id != first.id
    assert [i["id"] for i in inc.query("resolved")] == [first.id]
    assert [i["id"] for i in inc.query(None)] == [again.id, first.id]  # newest first


def test_open_incidents_survive_a_restart_of_the_aggregator(db):
    inc = make(db)
    a = inc.report(finding(), 100)
    inc.tick(101)
    again = make(db)
    assert [i.id for i in again.open()] == [a.id]
    assert again.report(finding(), 102).id == a.id


def test_actions_run_once_on_localisation_and_again_when_confidence_grows(db):
    runner = ActionRunner(ActionsConfig(), db, LOG, clock=lambda: 0.0)  # dry-run
    inc = make(db, actions=runner, localise_persist=1)
    got = inc.report(finding(conf=0.85), 100)
    assert [(a["action"], a["outcome"]) for a in got.actions] == [("alert", "ok")]
    inc.report(finding(conf=0.86), 101)
    assert len(got.actions) == 1  # same culprit, about as sure: nothing new
    inc.report(finding(conf=0.97), 102)  # now sure enough for the default drain rule
    assert [(a["action"], a["target"], a["outcome"]) for a in got.actions] == [
        ("alert", "", "ok"), ("drain", "node003", "dry-run")]
    assert got.state == "open"
    assert inc.get(got.id)["actions"] == got.actions


def test_a_real_drain_marks_the_incident_mitigated(db, tmp_path):
    cfg = ActionsConfig(dry_run=False, drain_backend="exec", drain_command=["/bin/true", "{host}"],
                        rules=[Rule(classes=["*"], min_confidence=0.9, actions=["drain"])])
    inc = make(db, actions=ActionRunner(cfg, db, LOG), localise_persist=1)
    got = inc.report(finding(conf=0.95), 100)
    assert got.actions[0]["outcome"] == "ok" and got.state == "mitigated"
    inc.tick(100 + 61)
    assert inc.get(got.id)["state"] == "resolved"


def test_memory_keeps_only_recent_resolved_incidents_but_sqlite_keeps_all(db):
    inc = make(db, resolve_hold_s=1.0, memory_incidents=2)
    ids = []
    for i in range(5):
        ids.append(inc.report(finding(sid=f"node{i:03d}", host=f"node{i:03d}"), 100 + 10 * i).id)
        inc.tick(105 + 10 * i)
    assert len(inc.mem) == 2
    assert inc.get(ids[0])["state"] == "resolved"
    assert len(inc.query("resolved")) == 5


def test_a_finding_that_supersedes_renames_or_merges_the_earlier_incidents(db):
    """Finding.supersedes (slow.py: the same fault, better named on more evidence): the
    superseded component's own incident is re-named when the finding has none; another open
    incident on it is resolved, pointing at the one that names the fault now."""
    inc = make(db, localise_persist=1)
    link = inc.report(finding(kind="link", sid="leaf03-spine00", host=None), 100)
    f = finding(t=101)
    f.supersedes = ("link:leaf03-spine00",)
    renamed = inc.report(f, 101)
    assert renamed.id == link.id and renamed.suspects[0]["id"] == "node003"
    assert "link:leaf03-spine00" not in renamed.keys and renamed.state == "open"
    # the link is free again: a later fault on it is a new incident
    again = inc.report(finding(kind="link", sid="leaf03-spine00", host=None, t=102), 102)
    assert again.id != renamed.id
    f = finding(t=103)
    f.supersedes = ("link:leaf03-spine00",)
    host = inc.report(f, 103)
    assert host.id == renamed.id
    merged = inc.get(again.id)
    assert merged is not None and merged["state"] == "resolved"
    assert merged["evidence"]["merged_into"] == host.id


def _outage_findings() -> dict[str, Finding]:
    """A link down under a ring (lab): the outage's tie of two cables (unsure), the ring's
    hang naming a host at 0.46 beside one cable, the measured link (sure)."""
    comm = "00000000000000aa"
    return {
        "tie": Finding("comm_slow", "job-1", comm,
                       [Suspect("link", "leaf00-spine00", None, None, 0.45),
                        Suspect("link", "leaf03-spine00", None, None, 0.45)], "tie",
                       {"candidate_links": {"leaf00-spine00": "both", "leaf03-spine00": "both"}},
                       100.0),
        "hang": Finding("comm_hang", "job-1", comm,
                        [Suspect("host", "node006", "node006", None, 0.46),
                         Suspect("link", "leaf00-spine00", None, None, 0.3)], "hang", {}, 100.0),
        "link": Finding("comm_slow", "job-1", comm,
                        [Suspect("link", "leaf00-spine00", None, None, 0.99)], "measured", {},
                        100.0)}


@pytest.mark.parametrize("order", [
    ("tie", "hang", "link", "link"),  # the hang took the tie's incident over: stayed unnamed
    ("hang", "link", "link"),  # the link opened a second incident beside the hang's
    ("link", "link", "hang", "hang")])  # the hang's host at 0.46 took the link's place
def test_the_ring_hang_of_a_link_outage_leaves_one_incident_naming_the_link(db, order):
    inc = make(db, localise_persist=2)
    found = _outage_findings()
    for i, name in enumerate(order):
        inc.report(found[name], 100.0 + i)
    [d] = inc.query(None)
    assert d["localised"] is not None and d["class"] == "comm_slow", d
    assert (d["suspects"][0]["id"], d["suspects"][0]["confidence"]) == ("leaf00-spine00", 0.99)

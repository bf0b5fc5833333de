"""Incidents: findings deduplicated into one record per fault, stored in SQLite.

A finding joins an open incident that already names the same component (its top suspect),
or that covers the same unlocalised symptom (class + communicator), or that names the same
host (an Xid and the hang it causes, a dead NIC and its stuck connections). The most specific
explanation names the merged incident (hardware > silent host > hang > slow). An incident is
localised once its top suspect has been confident for `localise_persist` evaluations (at once
for directly reported hardware faults) and resolves when no symptom was seen for its hold-down.
"""
from __future__ import annotations

import json
import logging
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from .config import DiagnosisConfig
from ..schema import migrate
from .findings import CLASS_RANK, Finding, Suspect

_COLS = ("class", "state", "job", "comm", "summary", "suspects", "evidence", "matrix",
         "first_symptom", "detected", "localised", "resolved", "updated", "actions", "keys",
         "last_active", "hold_s")
_JSON = ("suspects", "evidence", "matrix", "actions")


@dataclass
class Incident:
    id: int
    cls: str
    state: str
    job: str | None
    comm: str | None
    summary: str
    suspects: list[dict[str, Any]]
    evidence: dict[str, Any]
    matrix: dict[str, Any] | None
    first_symptom: float
    detected: float
    localised: float | None
    resolved: float | None
    updated: float
    actions: list[dict[str, Any]]
    keys: set[str]
    last_active: float
    hold_s: float
    streak_key: str | None = None
    streak: int = 0
    support: dict[str, float] = field(default_factory=dict)  # suspect -> confidence its symptoms give
    notified: tuple[str, float] | None = None
    dirty: bool = field(default=True)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "class": self.cls, "state": self.state, "job": self.job,
            "comm": self.comm, "summary": self.summary, "suspects": self.suspects,
            "evidence": self.evidence, "matrix": self.matrix,
            "first_symptom": self.first_symptom, "detected": self.detected,
            "localised": self.localised, "resolved": self.resolved, "updated": self.updated,
            "actions": self.actions,
        }


class Incidents:
    def __init__(self, db: sqlite3.Connection, cfg: DiagnosisConfig, actions: Any,
                 log: logging.Logger) -> None:
        self.db = db
        self.cfg = cfg
        self.actions = actions
        self.log = log
        migrate(self.db)
        self.mem: dict[int, Incident] = {}
        self.index: dict[str, int] = {}  # key -> open incident id
        for row in self.db.execute(
                f"SELECT id, {', '.join(_COLS)} FROM incidents WHERE state != 'resolved' "
                "ORDER BY id"):
            inc = _from_row(row)
            self.mem[inc.id] = inc
            for k in inc.keys:
                self.index[k] = inc.id

    # -- findings in ----------------------------------------------------------------------
    def report(self, f: Finding, now: float) -> Incident:
        top = f.top
        sure = self._sure(f)
        host_key = f"host:{top.host}" if top is not None and top.host else None
        # the component it names, else the same unlocalised symptom, else the same host
        lookups = ([top.key] if top else []) + list(f.supersedes) + [f.scope] + \
            ([host_key] if host_key else [])
        inc = None
        for k in lookups:
            iid = self.index.get(k)
            if iid is None or self.mem[iid].state == "resolved":
                continue
            cand = self.mem[iid]
            if k == f.scope and self._confident(cand):
                continue  # it names something already: this is another fault
            if k == host_key and sure and top is not None and self._confident(cand) and \
                    CLASS_RANK[cand.cls] == CLASS_RANK[f.cls] and cand.suspects[0]["id"] != top.id \
                    and not _host_and_part(top, cand.suspects[0]):
                continue  # two named culprits of one tier on a host (a straggler and a slow
                # NIC): two faults, not a cause and its symptom. The host itself and a rank
                # or NIC on it are one: a CPU-starved host's rank arrives late and its
                # connections are slow, named by two detectors in either order
            inc = cand
            break
        if inc is None and not sure:  # a vague sign of a fault already named (a path:
            # also the hosts and NICs it joins, when one of them is the named fault)
            inc = self._open_for([s.key for s in f.suspects] + list(f.aliases) +
                                 (_path_ends(top.kind, top.id) if top is not None else []))
        if inc is None and sure and top is not None and f.comm:  # the same communicator's
            # symptom that listed it without naming it (the ring's hang, then the measured
            # link: two incidents for one fault)
            inc = next((o for o in self.open() if o.comm == f.comm and not self._confident(o)
                        and any(s["id"] == top.id for s in o.suspects)), None)
        if inc is None:
            inc = self._cause_of(f)
        if inc is None:
            inc = self._create(f, now)
        vague = self._merge(inc, f, now, sure)
        keys = {k for k in lookups if k}
        if top is not None and top.kind == "path":  # the same fault, seen by another job
            keys.update(f"link:{lk}" for lk in f.evidence.get("candidate_links") or ())
        if inc.localised is not None:
            keys.discard(f.scope)
        if vague:
            return inc  # a vague guess neither claims components nor votes for the culprit
        self._absorb(inc, f.supersedes + self._paths_to(top, inc), now)
        keys -= set(f.supersedes)
        for k in keys - inc.keys:
            inc.keys.add(k)
            self.index[k] = inc.id
        self._localise(inc, f, now)
        return inc

    def _absorb(self, inc: Incident, superseded: tuple[str, ...], now: float) -> None:
        """Components named earlier on part of this fault's evidence (Finding.supersedes):
        their keys leave the incident, and another open incident naming one of them is this
        one (resolved, pointing here)."""
        for k in superseded:
            iid = self.index.pop(k, None)
            inc.keys.discard(k)
            other = self.mem.get(iid) if iid is not None and iid != inc.id else None
            if other is None or other.state == "resolved":
                continue
            other.state = "resolved"
            other.resolved = other.updated = now
            other.evidence["merged_into"] = inc.id
            other.dirty = True
            for key in other.keys:
                if self.index.get(key) == other.id:
                    del self.index[key]
            inc.first_symptom = min(inc.first_symptom, other.first_symptom)
            self.log.warning("incident %d merged into %d: %s explains all its connections",
                             other.id, inc.id, inc.suspects[0]["id"] if inc.suspects else "-")

    def _paths_to(self, top: Suspect | None, inc: Incident) -> tuple[str, ...]:
        """Keys of the open, unlocalised incidents naming a path that ends at the host (or its
        rank or NIC) this finding names: the vague sign of this fault, seen before it was
        named (the other order joins in `report`): a CPU-starved rank stops reading, and the
        connection into it was named as its path before the straggler (a CI run's lab test,
        2026-12-01)."""
        if top is None or top.kind == "path" or not top.host:
            return ()
        mine = {f"host:{top.host}"} | ({top.key} if top.kind == "nic" else set())
        return tuple(f"path:{o.suspects[0]['id']}" for o in self.open()
                     if o is not inc and o.localised is None and o.suspects and
                     o.suspects[0]["kind"] == "path" and
                     mine & set(_path_ends(o.suspects[0]["kind"], o.suspects[0]["id"])))

    def _sure(self, f: Finding) -> bool:
        return f.top is not None and f.top.confidence >= self.cfg.localise_confidence

    def _open_for(self, keys: list[str]) -> Incident | None:
        for k in keys:
            iid = self.index.get(k)
            inc = self.mem.get(iid) if iid is not None else None
            if inc is not None and inc.state != "resolved":
                return inc
        return None

    def _cause_of(self, f: Finding) -> Incident | None:
        """An open incident of a more specific class naming the finding's culprit, or any of
        its suspects when none is confident: e.g. the connections of a flapping NIC look slow
        and the slow-connection analysis cannot tell the NIC from its peer."""
        top = f.top
        for s in ([top] if top is not None and self._sure(f) else f.suspects):
            inc = self._open_for([s.key])
            if inc is not None and CLASS_RANK[inc.cls] < CLASS_RANK[f.cls]:
                return inc
        if top is None and f.job:  # a symptom naming nothing (a hang before the stall
            # messages): the job's open hardware fault explains it (one incident per fault)
            for inc in self.open():
                if inc.job == f.job and CLASS_RANK[inc.cls] < CLASS_RANK["comm_hang"]:
                    return inc
        return None

    def _confident(self, inc: Incident) -> bool:
        return bool(inc.suspects) and inc.suspects[0]["confidence"] >= self.cfg.localise_confidence

    def _create(self, f: Finding, now: float) -> Incident:
        hold = f.hold_s if f.hold_s is not None else self.cfg.resolve_hold_s
        cur = self.db.execute(
            f"INSERT INTO incidents ({', '.join(_COLS)}) VALUES ({', '.join('?' * len(_COLS))})",
            (f.cls, "open", f.job, f.comm, f.summary, "[]", "{}", None, f.first_symptom, now,
             None, None, now, "[]", "[]", now, hold))
        self.db.commit()
        assert cur.lastrowid is not None  # set by the INSERT
        inc = Incident(cur.lastrowid, f.cls, "open", f.job, f.comm, f.summary, [], {},
                       None, f.first_symptom, now, None, None, now, [], set(), now, hold)
        self.mem[inc.id] = inc
        self.log.warning("incident %d opened: %s: %s", inc.id, f.cls, f.summary)
        return inc

    def _merge(self, inc: Incident, f: Finding, now: float, sure: bool) -> bool:
        """Fold the finding into the incident; True when it was only a vague sign of it."""
        inc.last_active = now
        inc.updated = now
        inc.dirty = True
        inc.first_symptom = min(inc.first_symptom, f.first_symptom)
        hold = f.hold_s if f.hold_s is not None else self.cfg.resolve_hold_s
        inc.hold_s = max(inc.hold_s, hold)
        inc.job = inc.job or f.job
        inc.comm = inc.comm or f.comm
        new = [s.to_dict() for s in f.suspects]
        # an unsure finding must not unseat a confident culprit, unless it explains it better:
        # of a more specific class, naming that culprit (a silent host's hang); not another
        # one (a link down stalls the ring: the hang detector's host at 0.46 took a localised
        # link's place). A sure one takes over an incident that names nothing yet, of its
        # class or, naming another culprit, of any (a measured tie after the ring's hang had
        # taken the tie's incident over stayed unlocalised). Naming its culprit, a sure one of
        # a less specific class only makes it surer (below)
        other = f.top is None or not inc.suspects or inc.suspects[0]["id"] != f.top.id
        vague = not sure and self._confident(inc) and (
            CLASS_RANK[f.cls] >= CLASS_RANK[inc.cls] or other)
        takes_over = CLASS_RANK[f.cls] < CLASS_RANK[inc.cls] or (
            sure and not self._confident(inc) and
            (CLASS_RANK[f.cls] == CLASS_RANK[inc.cls] or other))
        if not vague and (f.cls == inc.cls or takes_over):
            old = {s["id"]: s for s in inc.suspects}
            if f.cls != inc.cls:  # a more specific explanation takes over the incident
                inc.evidence = {"symptoms": {inc.cls: inc.summary}}
                self.log.warning("incident %d is %s (was %s)", inc.id, f.cls, inc.cls)
                inc.cls = f.cls
                for s in new:  # both explanations name it: as sure as the surer one
                    if s["id"] in old:
                        s["confidence"] = max(s["confidence"], old[s["id"]]["confidence"])
                new += [dict(s, confidence=min(s["confidence"], 0.5)) for s in inc.suspects
                        if s["id"] not in {n["id"] for n in new}][:3]
            for s in new:
                s["confidence"] = max(s["confidence"], inc.support.get(s["id"], 0.0))
            symptoms = inc.evidence.get("symptoms")
            inc.summary = f.summary
            inc.evidence = dict(f.evidence, **({"symptoms": symptoms} if symptoms else {}))
            inc.matrix = f.matrix or inc.matrix
            inc.suspects = new
        elif f.cls != inc.cls:  # a consequence of the incident's cause: recorded as a symptom
            inc.evidence.setdefault("symptoms", {})[f.cls] = f.summary
            if inc.matrix is None:
                inc.matrix = f.matrix
            if f.top and inc.suspects and inc.suspects[0]["id"] == f.top.id:
                top = inc.suspects[0]
                conf = round(f.top.confidence, 3)
                inc.support[f.top.id] = max(inc.support.get(f.top.id, 0.0), conf)
                top["confidence"] = max(top["confidence"], conf)
        return vague

    def _localise(self, inc: Incident, f: Finding, now: float) -> None:
        top = inc.suspects[0] if inc.suspects else None
        if top is None:
            return
        key = f"{top['kind']}:{top['id']}"
        if top["confidence"] >= self.cfg.localise_confidence:
            inc.streak = inc.streak + 1 if inc.streak_key == key else 1
            inc.streak_key = key
        elif inc.streak_key != key:  # a flicker of the same culprit keeps its streak
            inc.streak, inc.streak_key = 0, None
        need = 1 if f.direct and CLASS_RANK[f.cls] == CLASS_RANK[inc.cls] else \
            self.cfg.localise_persist
        if inc.localised is None and inc.streak >= need:
            inc.localised = now
            for k in [k for k in inc.keys if _is_scope(k)]:
                inc.keys.discard(k)
                if self.index.get(k) == inc.id:
                    del self.index[k]
            self.log.warning("incident %d localised: %s %s (confidence %.2f)", inc.id,
                             top["kind"], top["id"], top["confidence"])
        if inc.localised is not None and top["confidence"] >= self.cfg.localise_confidence:
            self._act(inc, key, top["confidence"], now)

    def _act(self, inc: Incident, key: str, conf: float, now: float) -> None:
        if self.actions is None or inc.state == "resolved":
            return
        if inc.notified and inc.notified[0] == key and abs(inc.notified[1] - conf) < 0.1:
            return
        inc.notified = (key, conf)
        self.actions.submit(inc.to_dict(), now)
        self.collect_actions()

    def collect_actions(self) -> None:
        """Attach the records of finished actions (aggregator/actions.py: inline in replay, a
        worker thread live) to their incidents."""
        if self.actions is None:
            return
        for iid, records in self.actions.results():
            inc = self.mem.get(iid)
            if inc is None:
                continue  # evicted from memory; the records stay in the actions table
            inc.actions.extend(records)
            if any(r.get("action") == "drain" and r.get("outcome") == "ok" and not r.get("dry_run")
                   for r in records) and inc.state == "open":
                inc.state = "mitigated"
            inc.dirty = True

    # -- time -----------------------------------------------------------------------------
    def tick(self, now: float) -> None:
        self.collect_actions()
        for inc in list(self.mem.values()):
            if inc.state != "resolved" and now - inc.last_active >= inc.hold_s:
                inc.state = "resolved"
                inc.resolved = inc.updated = now
                inc.dirty = True
                for k in inc.keys:
                    if self.index.get(k) == inc.id:
                        del self.index[k]
                self.log.warning("incident %d resolved: no symptom for %.0fs", inc.id,
                                 now - inc.last_active)
        self.flush()
        resolved = [i for i in self.mem.values() if i.state == "resolved"]
        for inc in sorted(resolved, key=lambda i: i.id)[:max(0, len(resolved) - self.cfg.memory_incidents)]:
            del self.mem[inc.id]

    def flush(self) -> None:
        dirty = [i for i in self.mem.values() if i.dirty]
        if not dirty:
            return
        with self.db:
            self.db.executemany(
                f"UPDATE incidents SET {', '.join(c + ' = ?' for c in _COLS)} WHERE id = ?",
                [_to_row(i) + (i.id,) for i in dirty])
        for i in dirty:
            i.dirty = False

    # -- queries --------------------------------------------------------------------------
    def query(self, state: str | None) -> list[dict[str, Any]]:
        """Incidents in `state` (all when None), newest first."""
        self.flush()
        sql = f"SELECT id, {', '.join(_COLS)} FROM incidents"
        rows = (self.db.execute(sql + " WHERE state = ? ORDER BY id DESC", (state,)) if state
                else self.db.execute(sql + " ORDER BY id DESC"))
        return [(self.mem.get(r[0]) or _from_row(r)).to_dict() for r in rows]

    def get(self, iid: int) -> dict[str, Any] | None:
        if iid in self.mem:
            return self.mem[iid].to_dict()
        row = self.db.execute(f"SELECT id, {', '.join(_COLS)} FROM incidents WHERE id = ?",
                              (iid,)).fetchone()
        return _from_row(row).to_dict() if row else None

    def open(self) -> list[Incident]:
        return [i for i in self.mem.values() if i.state != "resolved"]


def _host_and_part(top: Suspect, other: dict[str, Any]) -> bool:
    """Whether one names a host and the other that host or a rank or NIC on it (a link
    incident that holds the host's key from an earlier naming is another fault)."""
    return "host" in (top.kind, other["kind"]) and top.host is not None and \
        other.get("host") == top.host


def _path_ends(kind: str, sid: str) -> list[str]:
    """Incident keys of the hosts and NICs at the ends of a path suspect
    (`HOST/DEV->HOST/DEV` or `HOST->HOST`)."""
    if kind != "path":
        return []
    out = []
    for end in sid.split("->"):
        host, slash, _ = end.partition("/")
        out += ([f"nic:{end}"] if slash else []) + [f"host:{host}"]
    return out


def _is_scope(key: str) -> bool:
    return key.partition(":")[0] in CLASS_RANK


def _to_row(i: Incident) -> tuple[Any, ...]:
    vals = {"class": i.cls, "state": i.state, "job": i.job, "comm": i.comm, "summary": i.summary,
            "suspects": json.dumps(i.suspects), "evidence": json.dumps(i.evidence),
            "matrix": json.dumps(i.matrix) if i.matrix is not None else None,
            "first_symptom": i.first_symptom, "detected": i.detected, "localised": i.localised,
            "resolved": i.resolved, "updated": i.updated, "actions": json.dumps(i.actions),
            "keys": json.dumps(sorted(i.keys)), "last_active": i.last_active, "hold_s": i.hold_s}
    return tuple(vals[c] for c in _COLS)


def _from_row(row: tuple[Any, ...]) -> Incident:
    d = dict(zip(("id",) + _COLS, row))
    for c in _JSON:
        d[c] = json.loads(d[c]) if d[c] is not None else None
    return Incident(d["id"], d["class"], d["state"], d["job"], d["comm"], d["summary"],
                    d["suspects"], d["evidence"], d["matrix"], d["first_symptom"], d["detected"],
                    d["localised"], d["resolved"], d["updated"], d["actions"],
                    set(json.loads(d["keys"])), d["last_active"], d["hold_s"], dirty=False)

"""Score diagnosis against what a `c4 sim` run injected (OUT.truth.json): which fault was
named, how fast, and which incidents name nothing that was injected. Used by the tests and by
bench/diagnosis; times are simulated seconds since the run started."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgpack

from c4.core import record
from c4.core.catalog import DRAINABLE_KINDS

GRACE_S = 5.0  # an incident up to this long before the injection still counts as its


@dataclass
class Score:
    faults: int = 0
    named: int = 0  # faults whose suspect tops a localised incident
    detected: int = 0  # faults with any incident during the fault
    localised_incidents: int = 0
    correct_incidents: int = 0
    false_isolations: int = 0  # localised incidents naming a healthy host/NIC/GPU/rank
    false_incidents: int = 0  # incidents (any state) explaining no injected fault
    on_path: int = 0  # faults not named, whose unlocalised incident lists the component among
    # its candidate links (a path, or links tied)
    wrong_job: int = 0  # faults named, but their incident blames another job (shared hosts)
    detect_s: list[float] = field(default_factory=list)
    localise_s: list[float] = field(default_factory=list)
    by_kind: dict[str, list[int]] = field(default_factory=dict)  # kind -> [faults, named]
    misses: list[str] = field(default_factory=list)
    wrong: list[str] = field(default_factory=list)

    def add(self, other: "Score") -> None:
        for name in ("faults", "named", "detected", "localised_incidents", "correct_incidents",
                     "false_isolations", "false_incidents", "on_path", "wrong_job"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        self.detect_s += other.detect_s
        self.localise_s += other.localise_s
        self.misses += other.misses
        self.wrong += other.wrong
        for k, (n, ok) in other.by_kind.items():
            acc = self.by_kind.setdefault(k, [0, 0])
            acc[0] += n
            acc[1] += ok


def clock_origin(rec: str | Path, truth: dict[str, Any]) -> float:
    """The replay clock reading at simulated time 0: replay (aggregator/replay.py) follows the
    clock of the first host heard from, which is skewed like every host's."""
    for data in record.read(rec):
        host = msgpack.unpackb(data, raw=False).get("host")
        return truth["epoch"] + truth["clock_skew"].get(host, 0.0)
    return truth["epoch"]


def score(truth: dict[str, Any], incidents: list[dict[str, Any]], origin: float) -> Score:
    sc = Score()
    faults = truth["faults"]
    used: set[int] = set()
    for f in faults:
        sc.faults += 1
        kind = sc.by_kind.setdefault(f["kind"], [0, 0])
        kind[0] += 1
        end = f["end"] if f["end"] is not None else float("inf")
        want = (f["suspect"]["kind"], f["suspect"]["id"])
        accept = set(f["suspect"].get("accept") or ())  # ids that also name it (lab truth)
        during = [i for i in incidents
                  if f["start"] - GRACE_S <= i["detected"] - origin <= end + 60]
        hits = [i for i in during if i["localised"] is not None and i["suspects"]
                and ((i["suspects"][0]["kind"], i["suspects"][0]["id"]) == want
                     or i["suspects"][0]["id"] in accept)]
        if during:  # detection: its own incident, else the first of anything during it
            sc.detected += 1
            sc.detect_s.append(min(i["detected"] for i in hits or during) - origin - f["start"])
        if hits:
            sc.named += 1
            kind[1] += 1
            first = min(hits, key=lambda i: i["localised"])
            if f.get("job") and first["job"] and first["job"] != f["job"]:
                sc.wrong_job += 1
                sc.wrong.append(f"{_brief(first)} blames {first['job']}, not {f['job']}")
            sc.localise_s.append(first["localised"] - origin - f["start"])
            used.update(i["id"] for i in hits)
        else:
            paths = [i for i in during if i["localised"] is None
                     and want[1] in (i["evidence"].get("candidate_links") or ())]
            if paths:  # the right candidates (a path, or tied links), honestly not localised
                sc.on_path += 1
                used.update(i["id"] for i in paths)
            sc.misses.append(f"{f['kind']}:{f['target']} -> " + (
                "; ".join(_brief(i) for i in during) or "nothing"))
    for i in incidents:
        if i["localised"] is not None and i["suspects"]:
            sc.localised_incidents += 1
        if i["id"] in used:
            sc.correct_incidents += i["localised"] is not None
            continue
        sc.false_incidents += 1
        sc.wrong.append(_brief(i))
        top = i["suspects"][0] if i["suspects"] else None
        if i["localised"] is not None and top and top["kind"] in DRAINABLE_KINDS and \
                not any(top["host"] == (f["suspect"].get("host")) for f in faults):
            sc.false_isolations += 1
    return sc


def _brief(i: dict[str, Any]) -> str:
    top = i["suspects"][0] if i["suspects"] else None
    who = f"{top['kind']}:{top['id']} ({top['confidence']:.2f})" if top else "no suspect"
    loc = "localised" if i["localised"] is not None else "unlocalised"
    return f"#{i['id']} {i['class']} {loc} {who}"


def load_truth(rec: str | Path) -> dict[str, Any]:
    return json.loads(Path(f"{rec}.truth.json").read_text())

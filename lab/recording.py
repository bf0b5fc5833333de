"""A lab run as a recording C4D can be scored on offline (issue 13: the lab is the judge).

The lab's aggregator stores every frame it accepted (its SQLite `frames` table, raw bytes as
the agents sent them, with the arrival time). `export` writes the frames that arrived in a
window, in arrival order, as a `.c4rec` (c4/core/record.py) that `c4 replay` reads, preceded
by each host's latest hello (sent once at agent start, and the NIC inventory diagnosis needs;
re-stamped just before the host's first frame in the window);
beside it the lab's topology with its path map (`.topology.json`, what the lab's aggregator
loads) and `.truth.json` built from the fault log (`faults.jsonl`, `c4 lab faults --json`) in
the format `c4 sim` writes, so lab/evaluate.py and `bench/diagnosis --lab DIR` score it.

Simulated time 0 (`epoch`) is the window's start on the machine's clock; the agents and the
aggregator share that clock, so `clock_skew` is 0 for every host. A fault's `suspect` is what
the lab expects C4D to name; `accept` lists every id that counts as naming it (an access
link's fault: the NIC, its one-NIC host or the link).
"""
from __future__ import annotations

import dataclasses
import json
import shutil
import sqlite3
import tomllib
from pathlib import Path
from typing import Any

from c4.core import record, wire

from .state import LabState

# the incident class C4D should raise for each lab fault kind (docs/lab.md, Faults)
CLASS = {"loss": "comm_slow", "slow": "comm_slow", "down": "comm_hang", "flap": "comm_slow",
         "nicdown": "hw_nic_down", "hang": "noncomm_hang", "straggler": "noncomm_slow"}


def _frames(db: Path, start: float, end: float) -> list[bytes]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        conn.execute("PRAGMA busy_timeout=5000")
        hellos = conn.execute(
            "SELECT data FROM frames f WHERE kind = 'hello' AND received < ? AND received = "
            "(SELECT max(received) FROM frames g WHERE g.host = f.host AND g.kind = 'hello' "
            "AND g.received < ?) ORDER BY received", (start, start)).fetchall()
        rows = conn.execute("SELECT data FROM frames WHERE received >= ? AND received < ? "
                            "ORDER BY received, host, seq", (start, end)).fetchall()
    finally:
        conn.close()
    return restamp([bytes(d) for (d,) in hellos + rows])


def restamp(frames: list[bytes]) -> list[bytes]:
    """A hello was sent when its agent started, maybe long before the window: stamped just
    before its host's next frame, or the replay's clock would jump from it and every host
    look silent meanwhile."""
    decoded = [wire.decode(d) for d in frames]
    nxt: dict[str, float] = {}
    out = list(frames)
    for i in range(len(frames) - 1, -1, -1):
        f = decoded[i]
        if f.kind == "hello" and f.host in nxt and nxt[f.host] - f.ts > 1.0:
            out[i] = wire.encode(dataclasses.replace(f, ts=nxt[f.host] - 0.001))
        nxt[f.host] = f.ts if f.kind != "hello" or f.host not in nxt else nxt[f.host]
    return out


def truth_of(st: LabState, start: float, end: float,
             fault_ids: list[int] | None = None) -> dict[str, Any]:
    """The faults active in [start, end) (or those listed) in c4 sim's truth format."""
    runs = st.data.get("runs", {})
    out = []
    for f in sorted(st.data.get("faults", {}).values(), key=lambda f: f["id"]):
        healed = f.get("healed")
        if fault_ids is not None and f["id"] not in fault_ids or fault_ids is None and (
                f["injected"] >= end or healed is not None and healed <= start):
            continue
        exp = f["expect"]
        job = runs.get(f.get("run") or "", {}).get("job")
        out.append({"kind": f["kind"], "target": f["target"], "params": f.get("params", {}),
                    "start": round(f["injected"] - start, 3),
                    "end": round(healed - start, 3) if healed is not None else None,
                    "class": CLASS[f["kind"]], "job": job, "rank": exp.get("rank"),
                    "suspect": {"kind": exp["kind"], "id": exp["id"], "host": exp.get("host"),
                                "accept": list(exp.get("accept", []))}})
    return {"faults": out, "epoch": start, "clock_skew": {h: 0.0 for h in st.topology().hosts},
            "clean_events": [], "source": "lab", "prefix": st.prefix,
            "jobs": [{"id": r.get("job"), "kind": r.get("kind"), "hosts": sorted(
                set(r.get("hosts", {}).values()))} for r in runs.values()],
            "config": {"window": [start, end]},
            # the lab aggregator's thresholds: a replay must judge with the same ones
            "diagnosis": tomllib.loads((st.dir / "aggregator.toml").read_text()).get(
                "diagnosis", {})}


def export(st: LabState, out: str | Path, start: float, end: float,
           fault_ids: list[int] | None = None) -> dict[str, Any]:
    """Write `out` (.c4rec), `out.truth.json` and `out.topology.json` for the frames that
    arrived in [start, end) (machine clock); returns the truth."""
    out = Path(out)
    frames = _frames(st.dir / "c4.db", start, end)
    out.unlink(missing_ok=True)
    with record.Writer(out) as w:
        for data in frames:
            w.write(data)
    truth = truth_of(st, start, end, fault_ids)
    truth["frames"] = len(frames)
    Path(f"{out}.truth.json").write_text(json.dumps(truth, indent=1, sort_keys=True))
    shutil.copyfile(st.dir / "topology.json", f"{out}.topology.json")
    return truth

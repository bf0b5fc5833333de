"""A lab run as a recording C4D can be scored on offline (issue 13: the lab is the judge).

The lab's aggregator stores every frame it accepted (its SQLite `frames` table, raw bytes as
the agents sent them, with the arrival time). `export` writes the frames that arrived in a
window, in arrival order, as a `.c4rec` (c4/core/record.py) that `c4 replay` reads, preceded
by each host's latest hello (sent once at agent start, and the NIC inventory diagnosis needs;
re-stamped just before the host's first frame in the window);
beside it the lab's topology with its path map (`.topology.json`, what the lab's aggregator
loads) and `.truth.json` built from the fault log (`faults.jsonl`, `c4 lab faults --json`) in
the format `c4 sim` writes, so lab/evaluate.py and `bench/diagnosis --lab DIR` score it.

`.paths.json` carries the path of every TCP connection the window's reports show (eBPF
tcp_flows), as the fabric's ECMP routes its 5-tuple: what the live C4P path map knew from its
probes (the recorded probe_results answer probes the replay never sent, so it cannot learn
from them). Without it a replay places a connection moved by a plan on its NIC pair's default
path, not on its planned port's (`c4 replay` loads it, aggregator/replay.py).

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
from typing import Any, Callable

from c4.core import record, wire
from c4.core.topology import endpoint

from .state import LabState

Sock = tuple[str, int, str, int]  # saddr, sport, daddr, dport
# a socket -> (src endpoint, dst endpoint, the links its 5-tuple takes), None: not the fabric's
Route = Callable[[list[Sock]], list[tuple[str, str, list[str]] | None]]

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


def socks(frames: list[bytes]) -> list[Sock]:
    """Every TCP connection the frames' reports show (eBPF tcp_flows), in first-seen order."""
    out: dict[Sock, None] = {}
    for data in frames:
        f = wire.decode(data)
        if f.kind == "report":
            for fl in (f.body.get("tcp_flows") or {}).get("flows") or ():
                out[(fl["saddr"], fl["sport"], fl["daddr"], fl["dport"])] = None
    return list(out)


def paths_of(frames: list[bytes], route: Route) -> list[dict[str, Any]]:
    """The `.paths.json` entries: each reported connection's port and the links it takes."""
    ss = socks(frames)
    return [{"src": r[0], "dst": r[1], "proto": "tcp", "dport": s[3], "sport": s[1],
             "links": r[2]} for s, r in zip(ss, route(ss)) if r is not None]


def fabric_route(st: LabState) -> Route:
    """Route sockets on the lab's fabric as its ECMP does now (the kernel's answer)."""
    fab = st.fabric()

    def route(ss: list[Sock]) -> list[tuple[str, str, list[str]] | None]:
        out: list[tuple[str, str, list[str]] | None] = []
        for saddr, sport, daddr, dport in ss:
            a, b = fab.nic_of_addr(saddr), fab.nic_of_addr(daddr)
            if a is None or b is None:
                out.append(None)
                continue
            out.append((endpoint(a.host, a.dev), endpoint(b.host, b.dev),
                        fab.path(a, b, fab.spine_of(a, b, sport, dport))))
        return out
    return route


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
    """Write `out` (.c4rec), `out.truth.json`, `out.topology.json` and `out.paths.json` for
    the frames that arrived in [start, end) (machine clock); returns the truth."""
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
    Path(f"{out}.paths.json").write_text(json.dumps(paths_of(frames, fabric_route(st))))
    return truth

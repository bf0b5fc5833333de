"""`c4 replay FILE`: feed a recorded stream through the same ingest and diagnosis as live,
on simulated time taken from the frames' timestamps.

Signature for other modules and tests:
    replay(path, *, topology=None, cfg=None, tick_s=1.0, measurer=None) -> ReplayResult
`ReplayResult.to_json()` is what `c4 replay --json` prints; the same file gives the same
output every time (in-memory SQLite, simulated clock, actions forced to dry-run).
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from c4.core import record
from c4.core.wire import Rejected

from .config import AggregatorConfig
from .planner.model import path_class
from .server import build_core

PRUNE_EVERY_S = 60.0


@dataclass
class ReplayResult:
    frames: int
    sim_start: float
    sim_end: float
    hosts: list[dict[str, Any]]
    incidents: list[dict[str, Any]]
    jobs: list[dict[str, Any]]
    stats: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def topology_beside(path: Path) -> Path | None:
    """`x.c4rec` -> `x.c4rec.topology.json` or `x.topology.json`, whichever exists."""
    for cand in (path.with_name(path.name + ".topology.json"),
                 path.with_suffix(".topology.json")):
        if cand.exists():
            return cand
    return None


def paths_beside(path: Path) -> list[dict[str, Any]]:
    """`x.c4rec.paths.json` (lab/recording.py): each recorded connection's port and the links
    it takes, what the live C4P path map had learned from probes; [] when there is none."""
    beside = path.with_name(path.name + ".paths.json")
    return list(json.loads(beside.read_text())) if beside.exists() else []


def replay(path: str | Path, *, topology: Any = None, cfg: AggregatorConfig | None = None,
           tick_s: float = 1.0, measurer: Any = None) -> ReplayResult:
    from c4.core.topology import Topology

    path = Path(path)
    cfg = cfg or AggregatorConfig()
    # Replay must never drain a node: whatever the policy says, actions are dry-run here. Stored
    # frames only serve resend dedupe after a restart, which a replay never has: keep a minute.
    cfg = dataclasses.replace(cfg, actions={**cfg.actions, "dry_run": True},
                              frames_retention_s=PRUNE_EVERY_S)
    if topology is None:
        beside = topology_beside(path)
        if beside is not None:
            topology = Topology.load(beside)
    elif isinstance(topology, (str, Path)):
        topology = Topology.load(topology)
    now: float | None = None
    clock_box = [0.0]
    core = build_core(cfg, db_path=":memory:", topology=topology, clock=lambda: clock_box[0])
    ingest = core.ingest
    if measurer is not None:  # answers C4D's measuring probes (lab/sim.py SimMeasurer)
        core.diagnosis.use_measurer(measurer)
    # The recorded probe_results answer the live planner's probes, which the replayed one never
    # sent: the recording's paths teach its path map instead, or connections a plan moved
    # would be placed on their default paths.
    known = paths_beside(path) if core.planner is not None else []
    frames = 0
    start: float | None = None
    next_tick = pruned = 0.0
    offsets: dict[str, float] = {}  # host -> its clock minus the replay clock
    for data in record.read(path):
        frames += 1
        try:
            frame = ingest.decode(data)
        except Rejected as exc:
            ingest.reject(exc, now or 0.0)  # counted as live ingest would; time does not move
            continue
        # Host clocks are skewed by seconds: a host's first frame arrives "now" (recordings are
        # in arrival order) and from then on its own clock advances the replay clock.
        off = offsets.setdefault(frame.host, 0.0 if now is None else frame.ts - now)
        now = frame.ts - off if now is None else max(now, frame.ts - off)
        if start is None:
            start, next_tick, pruned = now, now + tick_s, now
            for p in known:
                core.planner.pathmap.learn(p["src"], p["dst"], path_class(p["proto"], p["dport"]),
                                           p["sport"], tuple(p["links"]), now)
        while next_tick <= now:
            clock_box[0] = next_tick
            ingest.tick(next_tick)
            if next_tick - pruned >= PRUNE_EVERY_S:
                ingest.prune(next_tick)
                pruned = next_tick
            next_tick += tick_s
        clock_box[0] = now
        ingest.accept(frame, data, now)
        ingest.take_acks(now)
    end = now if now is not None else 0.0
    clock_box[0] = end
    ingest.tick(end)
    hosts = ingest.registry.hosts
    diag = core.diagnosis
    return ReplayResult(
        frames=frames, sim_start=start or 0.0, sim_end=end,
        hosts=[hosts[n].summary(end) for n in sorted(hosts)],
        incidents=diag.incidents(None), jobs=diag.jobs(), stats=ingest.stats())


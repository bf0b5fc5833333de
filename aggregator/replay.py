"""`c4 replay FILE`: feed a recorded stream through the same ingest and diagnosis as live,
on simulated time taken from the frames' timestamps.

Signature for other modules and tests:
    replay(path, *, topology=None, cfg=None, tick_s=1.0, measurer=None) -> ReplayResult
    Replay(topology=None, cfg=None, tick_s=1.0): .core to prepare, .feed(path), .finish()
`ReplayResult.to_json()` is what `c4 replay --json` prints; the same file gives the same
output every time (in-memory SQLite, simulated clock, actions forced to dry-run).
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from c4.core import record
from c4.core.topology import Topology
from c4.core.wire import Rejected

from .config import AggregatorConfig
from .diagnosis.probes import RecordedMeasurer
from .planner.model import path_class
from .server import Core, build_core

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


class Replay:
    """A core on a simulated clock, fed recorded frames in their order as live ingest takes
    them. Prepare `core` before feeding if need be (teach C4P's path map, give C4D a path
    source or a measurer); `finish()` gives the result."""

    def __init__(self, *, topology: Topology | None = None,
                 cfg: AggregatorConfig | None = None, tick_s: float = 1.0) -> None:
        cfg = cfg or AggregatorConfig()
        # Replay must never drain a node: whatever the policy says, actions are dry-run here.
        # Stored frames only serve resend dedupe after a restart, which a replay never has: keep
        # a minute.
        cfg = dataclasses.replace(cfg, actions={**cfg.actions, "dry_run": True},
                                  frames_retention_s=PRUNE_EVERY_S)
        self.tick_s = tick_s
        self.clock = 0.0
        self.core: Core = build_core(cfg, db_path=":memory:", topology=topology,
                                     clock=lambda: self.clock)
        self.frames = 0
        self.start: float | None = None
        self.now: float | None = None
        self._next_tick = self._pruned = 0.0
        self._offsets: dict[str, float] = {}  # host -> its clock minus the replay clock

    def feed(self, path: str | Path, *, paths: Sequence[dict[str, Any]] = ()) -> None:
        """Every frame of the recording at `path`, ticking and pruning on the way; `paths`
        (paths_beside's) teach C4P's path map at the first frame."""
        ingest = self.core.ingest
        for data in record.read(Path(path)):
            self.frames += 1
            try:
                frame = ingest.decode(data)
            except Rejected as exc:
                ingest.reject(exc, self.now or 0.0)  # counted as live would; time does not move
                continue
            # Host clocks are skewed by seconds: a host's first frame arrives "now" (recordings
            # are in arrival order) and from then on its own clock advances the replay clock.
            now = self.now
            off = self._offsets.setdefault(frame.host, 0.0 if now is None else frame.ts - now)
            now = self.now = frame.ts - off if now is None else max(now, frame.ts - off)
            if self.start is None:
                self.start, self._next_tick, self._pruned = now, now + self.tick_s, now
                for p in paths:
                    assert self.core.planner is not None
                    self.core.planner.pathmap.learn(
                        p["src"], p["dst"], path_class(p["proto"], p["dport"]), p["sport"],
                        tuple(p["links"]), now)
            while self._next_tick <= now:
                self.clock = self._next_tick
                ingest.tick(self._next_tick)
                if self._next_tick - self._pruned >= PRUNE_EVERY_S:
                    ingest.prune(self._next_tick)
                    self._pruned = self._next_tick
                self._next_tick += self.tick_s
            self.clock = now
            ingest.accept(frame, data, now)
            ingest.take_acks(now)

    def finish(self) -> ReplayResult:
        """A last tick at the last frame's time, then what the replay found."""
        ingest, diag = self.core.ingest, self.core.diagnosis
        end = self.clock = self.now if self.now is not None else 0.0
        ingest.tick(end)
        hosts = ingest.registry.hosts
        return ReplayResult(
            frames=self.frames, sim_start=self.start or 0.0, sim_end=end,
            hosts=[hosts[n].summary(end) for n in sorted(hosts)],
            incidents=diag.incidents(None), jobs=diag.jobs(), stats=ingest.stats())


def replay(path: str | Path, *, topology: Any = None, cfg: AggregatorConfig | None = None,
           tick_s: float = 1.0, measurer: Any = None, measured: bool = False) -> ReplayResult:
    """`measurer` answers C4D's measuring probes (lab/sim.py SimMeasurer); `measured`: the
    recording's own `probe_result`s do (probes.RecordedMeasurer: what the live C4D's legs
    measured), which needs a topology (ValueError without one)."""
    path = Path(path)
    if topology is None:
        beside = topology_beside(path)
        if beside is not None:
            topology = Topology.load(beside)
    elif isinstance(topology, (str, Path)):
        topology = Topology.load(topology)
    if measured:
        if topology is None:
            raise ValueError(f"{path}: answering the measuring probes from the recording "
                             "needs its topology (none beside it: give one)")
        measurer = RecordedMeasurer(topology)
    r = Replay(topology=topology, cfg=cfg, tick_s=tick_s)
    if measurer is not None:
        r.core.diagnosis.use_measurer(measurer)
    # The recorded probe_results answer the live planner's probes, which the replayed one never
    # sent: the recording's paths teach its path map instead, or connections a plan moved
    # would be placed on their default paths.
    r.feed(path, paths=paths_beside(path) if r.core.planner is not None else [])
    return r.finish()

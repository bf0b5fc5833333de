"""`c4 replay` of a lab recording places each connection where its port really ran: the
recording's `.paths.json` (lab/recording.py) teaches the replayed C4P path map what the live
one had learned from probes. Found in the lab: after a plan moved the ring to other ports,
replays placed its connections on the NIC pairs' default paths (the recorded probe_results
answer probes the replay never sent) and named the wrong link or none.

The real lab recording (tests/fixtures/lab: leaf01-spine01 flapping) replays against its
topology with the two spines swapped in every default path, as if a plan had moved every
connection to the other spine; the paths file holds where each reported connection really
ran, the recorded fabric's path."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from c4.aggregator.config import AggregatorConfig
from c4.aggregator.replay import replay
from c4.core import record
from c4.core.topology import Topology, endpoint
from c4.lab.recording import Route, Sock, paths_of

from .test_diag_placement import FAULT, swapped, unpack


def real_route(topo: Topology) -> Route:
    def route(ss: list[Sock]) -> list[tuple[str, str, list[str]] | None]:
        out: list[tuple[str, str, list[str]] | None] = []
        for saddr, _, daddr, _ in ss:
            a, b = topo.nic_by_addr(saddr), topo.nic_by_addr(daddr)
            if a is None or b is None:
                out.append(None)
                continue
            src, dst = endpoint(a[0], a[1].dev), endpoint(b[0], b[1].dev)
            out.append((src, dst, list(topo.paths[(src, dst)])))
        return out
    return route


def named(rec: Path, truth: dict[str, Any]) -> list[str]:
    res = replay(rec, cfg=AggregatorConfig(diagnosis=truth["diagnosis"]))
    return [i["suspects"][0]["id"] for i in res.incidents if i["localised"]]


def test_the_recordings_paths_place_moved_connections_on_their_ports_path(tmp_path: Path) -> None:
    rec, truth, real = unpack(tmp_path)
    swapped(real).save(f"{rec}.topology.json")  # what the replay loads beside the recording
    assert FAULT not in named(rec, truth)  # the premise: default paths misplace the ring
    paths = paths_of(list(record.read(rec)), real_route(real))
    assert paths and all(p["proto"] == "tcp" for p in paths)
    Path(f"{rec}.paths.json").write_text(json.dumps(paths))
    assert named(rec, truth) == [FAULT]

"""The simulator sends the plugin's counts and ordinals (c4/core/ordinals.py): the real plugin
under its C harness (a ring whose rank 2 never enters an op, through the real agent
collector) and `c4 sim` with a rank that stops calling collectives must agree on how
`seq_started`, `seq_completed`, `inflight.seq` and `nccl_stall.seq` relate, rank by rank."""
from __future__ import annotations

from pathlib import Path

import msgpack

from c4.core import record
from c4.lab.sim import Fault, SimConfig, simulate

from .plugin_run import hung_ring


def form(s: dict, culprit_done: int) -> tuple:
    """A rank's progress relative to what the culprit completed (k): (started - k,
    completed - k, inflight ordinal - k or None)."""
    inf = s.get("inflight")
    return (s["seq_started"] - culprit_done, s["seq_completed"] - culprit_done,
            None if inf is None else inf["seq"] - culprit_done)


def plugin_forms(tmp_path: Path) -> tuple[set, set]:
    sample = hung_ring(tmp_path)
    comms = {c["rank"]: c for c in sample.section["comms"]}
    k = comms[2]["seq_completed"]
    stalls = {(e.attrs["seq"] - k, e.attrs["seq_completed"] - k)
              for e in sample.events if e.type == "nccl_stall"}
    return {form(comms[r], k) for r in (1, 2, 3)}, stalls


def sim_forms(tmp_path: Path) -> tuple[set, set]:
    out = tmp_path / "sim.c4rec"
    # rank 5 (host node001) stops calling collectives at 10 s; 4 ranks per host
    simulate(SimConfig(duration=20, faults=[Fault.parse("hang:5@10")], realism=False), out)
    last: dict[int, dict] = {}
    stalls = []
    for data in record.read(out):
        f = msgpack.unpackb(data, raw=False)
        if f["kind"] == "report":
            for s in f["body"]["nccl"]["comms"]:
                last[s["rank"]] = s
        elif f["kind"] == "event" and f["body"]["type"] == "nccl_stall":
            stalls.append(f["body"]["attrs"])
    k = last[5]["seq_completed"]
    # the culprit and its ring neighbours on other hosts (rank 5 sends to 9 and gets from 1
    # on channel 1, ranks 4 and 6 share its host)
    forms = {form(last[r], k) for r in (5, 1, 9)}
    return forms, {(a["seq"] - k, a["seq_completed"] - k) for a in stalls}


def test_the_simulator_numbers_collectives_like_the_plugin(tmp_path):
    plugin, plugin_stalls = plugin_forms(tmp_path)
    sim, sim_stalls = sim_forms(tmp_path)
    # the culprit: idle after k collectives; its neighbours: in ordinal k (started k + 1)
    expected = {(0, 0, None), (1, 0, 0)}
    assert plugin == expected, plugin
    assert sim == expected, sim
    # stall messages name ordinal k, the op after the last completed one
    assert plugin_stalls == sim_stalls == {(0, 0)}

"""Lab runs as recordings (lab/recording.py): the frames a lab aggregator stored, exported for
a window with the fault log as truth, replay and score like the live run. The lab's store is
stood in for by a `c4 sim` run written into an aggregator database exactly as ingest stores
frames (raw bytes, arrival time); the state directory is the lab's layout."""
from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from c4.aggregator.config import AggregatorConfig
from c4.aggregator.replay import replay
from c4.aggregator.schema import migrate
from c4.core import record, wire
from c4.lab.evaluate import clock_origin, load_truth, score
from c4.lab.recording import export
from c4.lab.sim import EPOCH, Fault, SimConfig, Simulator
from c4.lab.state import LabState

HANG_AT = 30.0


def lab_dir(tmp_path: Path) -> LabState:
    """A lab state directory whose aggregator stored a run where rank 5 (node005) stopped."""
    sim = Simulator(SimConfig(duration=60, seed=2, realism=False, hosts=8, gpus_per_host=1,
                              leaves=4, spines=2, max_skew=0.0,  # one clock, as in the lab
                              faults=[Fault.parse(f"hang:5@{HANG_AT}")]))
    rec = tmp_path / "sim.c4rec"
    sim.run(rec)
    d = tmp_path / "lab"
    d.mkdir()
    conn = sqlite3.connect(d / "c4.db")
    migrate(conn)
    for data in record.read(rec):
        f = wire.decode(data)
        conn.execute("INSERT INTO frames VALUES (?,?,?,?,?,?,?)",
                     (f.host, f.boot, f.seq, f.kind, f.ts, f.ts + 0.01, data))
    conn.commit()
    conn.close()
    sim.topo.save(d / "topology.json")
    (d / "aggregator.toml").write_text("[diagnosis]\ncheckpoint_s = 0.0\n")
    injected = EPOCH + HANG_AT
    fault = {"id": 1, "kind": "hang", "target": "5", "params": {}, "run": "ring1",
             "injected": injected, "healed": None,
             "expect": {"kind": "host", "id": "node005", "host": "node005", "rank": 5,
                        "accept": ["node005"]}}
    state = {"prefix": "t", "faults": {"1": fault},
             "runs": {"ring1": {"kind": "ring", "job": "train-0",
                                "hosts": {str(r): f"node{r:03d}" for r in range(8)}}}}
    (d / "state.json").write_text(json.dumps(state))
    return LabState.open_dir(d)


def test_a_window_of_the_lab_store_replays_and_scores(tmp_path):
    st = lab_dir(tmp_path)
    out = tmp_path / "corpus" / "01-hang-5.c4rec"
    out.parent.mkdir()
    start = EPOCH + 10.0  # long after the agents' hellos: they are re-stamped into the window
    truth = export(st, out, start, EPOCH + 60.0, [1])
    assert truth["faults"][0]["start"] == HANG_AT - 10.0 and truth["faults"][0]["end"] is None
    assert truth["diagnosis"] == {"checkpoint_s": 0.0}
    assert (tmp_path / "corpus" / "01-hang-5.c4rec.topology.json").exists()
    truth = load_truth(out)
    res = replay(out, cfg=AggregatorConfig(diagnosis=truth["diagnosis"]))
    assert res.sim_end - res.sim_start < 51.0  # no jump back to the hellos' send time
    sc = score(truth, res.incidents, clock_origin(out, truth))
    assert sc.named == 1 and sc.false_incidents == 0, (sc.misses, sc.wrong)


def test_a_clean_window_has_no_faults(tmp_path):
    st = lab_dir(tmp_path)
    out = tmp_path / "00-clean.c4rec"
    truth = export(st, out, EPOCH + 5.0, EPOCH + 25.0, [])
    assert truth["faults"] == []
    res = replay(out, cfg=AggregatorConfig(diagnosis=truth["diagnosis"]))
    assert res.incidents == [], [i["summary"] for i in res.incidents]


def test_an_access_link_fault_counts_when_its_host_is_named():
    """The lab accepts the NIC, its one-NIC host or the link for an access link's fault."""
    truth = {"faults": [{"kind": "loss", "target": "node003/mlx5_0-leaf01", "start": 10.0,
                         "end": 50.0, "suspect": {"kind": "nic", "id": "node003/mlx5_0",
                                                  "host": "node003",
                                                  "accept": ["node003/mlx5_0", "node003"]}}]}
    inc = {"id": 1, "class": "comm_slow", "detected": 20.0, "localised": 25.0,
           "job": None, "evidence": {},
           "suspects": [{"kind": "host", "id": "node003", "host": "node003",
                         "confidence": 0.9}]}
    assert score(truth, [inc], 0.0).named == 1
    inc["suspects"][0].update(id="node004", host="node004")
    assert score(truth, [inc], 0.0).named == 0

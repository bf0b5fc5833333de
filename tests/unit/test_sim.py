"""c4 sim: deterministic, valid frames in arrival order, truth and topology files, faults
that leave the syndrome C4D reads (checked on the decoded frames, not on sim internals)."""
from __future__ import annotations

import json
from collections import defaultdict

import pytest

from c4.core import record, wire
from c4.cli import main as cli
from c4.lab.sim import EPOCH, Fault, SimConfig, SimError, simulate
from c4.core.topology import Topology


def _frames(path):
    return [wire.decode(d) for d in record.read(path)]


def _run(tmp_path, name="run.c4rec", **kw):
    out = tmp_path / name
    simulate(SimConfig(**kw), out)
    return out


def test_fault_spec_parses_and_rejects_with_reason():
    f = Fault.parse("slow-link:node001,node002@30-90")
    assert (f.kind, f.target, f.start, f.end) == ("slow-link", "node001,node002", 30.0, 90.0)
    assert Fault.parse("hang:5@12.5").end is None
    for bad, why in [("hang:5", "KIND:TARGET@START"), ("melt:5@1", "unknown kind"),
                     ("hang:5@x", "seconds"), ("hang:5@9-3", "START < END")]:
        with pytest.raises(SimError, match=why):
            Fault.parse(bad)


@pytest.mark.parametrize("spec, why", [
    ("hang:999@1", "not a rank"), ("slow-link:node000@1", "HOST,HOST"),
    ("lossy-link:node000/mlx5_0-leaf00@1", "not a fabric link"),
    ("nic-down:node000/mlx5_9@1", "HOST/DEV"), ("slow-node:nohost@1", "not a host")])
def test_bad_targets_are_rejected(tmp_path, spec, why):
    with pytest.raises(SimError, match=why):
        _run(tmp_path, faults=[Fault.parse(spec)], duration=5)


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    kw = dict(duration=20, faults=[Fault.parse("slow-node:node001@5")])
    a = _run(tmp_path, "a.c4rec", seed=7, **kw)
    b = _run(tmp_path, "b.c4rec", seed=7, **kw)
    c = _run(tmp_path, "c.c4rec", seed=8, **kw)
    assert a.read_bytes() == b.read_bytes()
    assert a.read_bytes() != c.read_bytes()
    assert (tmp_path / "a.c4rec.truth.json").read_text() == \
        (tmp_path / "b.c4rec.truth.json").read_text()


def test_frames_are_valid_hello_first_and_contiguous_per_host(tmp_path):
    out = _run(tmp_path, duration=15, faults=[Fault.parse("xid:3@5"),
                                              Fault.parse("pfc-storm:node002/mlx5_1@6")])
    seen: dict[str, list] = defaultdict(list)
    for f in _frames(out):  # decode validates every frame against the schemas
        seen[f.host].append(f)
    assert len(seen) == 4
    for frames in seen.values():
        assert frames[0].kind == "hello"
        assert [f.seq for f in frames] == list(range(1, len(frames) + 1))
        assert len({f.boot for f in frames}) == 1
    kinds = {f.body["type"] for fs in seen.values() for f in fs if f.kind == "event"}
    assert {"xid", "pause_storm", "nccl_stall"} <= kinds


def test_host_clocks_are_skewed(tmp_path):
    out = _run(tmp_path, duration=10, max_skew=5.0)
    truth = json.loads((tmp_path / "run.c4rec.truth.json").read_text())
    skews = list(truth["clock_skew"].values())
    assert max(skews) - min(skews) > 1.0  # more than a report interval apart
    firsts = {}
    for f in _frames(out):
        if f.kind == "report" and f.host not in firsts:
            firsts[f.host] = f.ts - EPOCH
    for host, ts in firsts.items():  # each host's clock reads true time + its skew
        assert abs(ts - truth["clock_skew"][host]) < 1.01


def test_truth_and_topology_describe_the_run(tmp_path):
    out = _run(tmp_path, duration=10, faults=[Fault.parse("straggler:6@2"),
                                              Fault.parse("lossy-link:leaf01-spine00@3-8")])
    truth = json.loads((tmp_path / "run.c4rec.truth.json").read_text())
    strag, lossy = truth["faults"]
    assert strag["class"] == "noncomm_slow"
    assert strag["suspect"] == {"kind": "rank", "id": "6", "host": "node001"}
    assert lossy["suspect"]["id"] == "leaf01-spine00" and lossy["end"] == 8.0
    topo = Topology.load(tmp_path / "run.c4rec.topology.json")
    assert sorted(topo.hosts) == ["node000", "node001", "node002", "node003"]
    # every send connection the ranks report has a learned path from NIC to NIC
    for f in _frames(out):
        if f.kind != "report":
            continue
        devs = {s["rank"]: s["dev"] for s in f.body["nccl"]["comms"]}
        for s in f.body["nccl"]["comms"]:
            for p in s["peers"]:
                if p["dir"] == "send":
                    dst_host = topo_host_of(topo, p["peer"])
                    path = topo.path(f.host, dst_host, f"mlx5_{devs[s['rank']]}",
                                     f"mlx5_{p['peer'] % 4}")
                    assert path and path[0].startswith(f"{f.host}/")


def topo_host_of(topo, rank, gpus=4):
    return sorted(topo.hosts)[rank // gpus]


def test_hang_leaves_the_culprit_behind_and_the_others_in_flight(tmp_path):
    out = _run(tmp_path, duration=25, faults=[Fault.parse("hang:5@10")], realism=False)
    last = {}
    for f in _frames(out):
        if f.kind == "report":
            for s in f.body["nccl"]["comms"]:
                last[s["rank"]] = s
    culprit = last[5]
    others = [s for r, s in last.items() if r != 5]
    assert culprit["inflight"] is None
    # plugin form (c4/core/ordinals.py): the others wait in ordinal k, k = what the culprit
    # completed; it never started it
    assert culprit["seq_started"] == culprit["seq_completed"]
    assert all(s["inflight"] and s["inflight"]["seq"] == culprit["seq_completed"]
               and s["seq_started"] == s["inflight"]["seq"] + 1
               and s["inflight"]["progress_age_s"] > 10 for s in others)


def test_slow_node_raises_network_time_per_byte_of_its_connections_only(tmp_path):
    out = _run(tmp_path, duration=20, slowdown=3.0, faults=[Fault.parse("slow-node:node002@5")])
    per: dict[bool, list[float]] = {True: [], False: []}
    for f in _frames(out):
        if f.kind != "report" or f.ts - EPOCH < 12:
            continue
        for s in f.body["nccl"]["comms"]:
            for p in s["peers"]:
                if p["dir"] == "send" and p["bytes"]:
                    touches = f.host == "node002" or p["peer"] // 4 == 2
                    per[touches].append(p["net_wait_s"] / p["bytes"])
    slow, ok = sorted(per[True]), sorted(per[False])
    assert slow[len(slow) // 2] > 2.5 * ok[len(ok) // 2]


def test_restart_forms_a_new_communicator_and_ranks_join_late(tmp_path):
    out = _run(tmp_path, duration=60, restart_at=[20.0], seed=3)
    comms_by_time = []
    for f in _frames(out):
        if f.kind == "report":
            for s in f.body["nccl"]["comms"]:
                comms_by_time.append((f.ts - EPOCH, s["comm"], s["seq_completed"]))
    comms = list(dict.fromkeys(c for _, c, _ in comms_by_time))
    assert len(comms) == 2
    second = [seq for _, c, seq in comms_by_time if c == comms[1]]
    assert second[0] == 0 and max(second) > 0
    truth = json.loads((tmp_path / "run.c4rec.truth.json").read_text())
    assert [e["t"] for e in truth["clean_events"] if e["kind"] == "restart"] == [20.0]


def test_cli_writes_the_three_files_and_rejects_bad_faults(tmp_path, capsys):
    out = tmp_path / "cli.c4rec"
    assert cli(["sim", "--out", str(out), "--duration", "5", "--fault", "hang:1@2"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["ranks"] == 16 and summary["frames"] > 20
    assert (tmp_path / "cli.c4rec.truth.json").exists()
    assert (tmp_path / "cli.c4rec.topology.json").exists()
    assert cli(["sim", "--out", str(out), "--fault", "hang:1"]) == 2
    assert "KIND:TARGET@START" in capsys.readouterr().err


def test_jobs_sharing_hosts_each_use_their_own_gpus_and_nics(tmp_path):
    """--share-hosts: both jobs report from every host, job 1 on CUDA devices 2-3; a NIC's
    counters count the traffic of the job that uses it; a rank target names its own job."""
    out = _run(tmp_path, duration=10, jobs=2, share_hosts=True, realism=False, max_skew=0,
               faults=[Fault.parse("straggler:6@5")])
    devs: dict[str, set[int]] = defaultdict(set)
    hosts: dict[str, set[str]] = defaultdict(set)
    for f in _frames(out):
        if f.kind == "report":
            for s in f.body["nccl"]["comms"]:
                devs[s["job"]].add(s["dev"])
                hosts[s["job"]].add(f.host)
            assert all(p["deltas"]["port_xmit_data"] > 0 for p in f.body["rdma"]["ports"]
                       if f.ts - EPOCH > 4)
    assert devs == {"train-0": {0, 1}, "train-1": {2, 3}}
    assert hosts["train-0"] == hosts["train-1"] == {"node000", "node001", "node002", "node003"}
    (fault,) = json.loads((tmp_path / "run.c4rec.truth.json").read_text())["faults"]
    assert (fault["job"], fault["rank"], fault["suspect"]["id"]) == ("train-1", 2, "2")
    with pytest.raises(SimError, match="share-hosts"):
        SimConfig(jobs=5, gpus_per_host=4, hosts=8, share_hosts=True).validate()

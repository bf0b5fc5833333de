"""C4D end to end on simulated clusters: each fault class injected by `c4 sim` at 16 and 256
ranks, replayed through the real ingest and diagnosis (aggregator/replay.py), must be named as
the top suspect of a localised incident, with nothing else named; clean runs with realistic
noise, restarts and late joins raise nothing; two faults at once are both found; a healed
fault's incident resolves. (2,048 ranks: tests/e2e/test_sim_replay.py.)"""
from __future__ import annotations

import pytest

from c4.aggregator.config import AggregatorConfig
from c4.lab.evaluate import clock_origin, load_truth, score
from c4.aggregator.replay import replay
from c4.lab.sim import Fault, SimConfig, Simulator, simulate

SIZES = {16: dict(hosts=4, gpus_per_host=4, leaves=4, spines=2),
         256: dict(hosts=32, gpus_per_host=8, leaves=8, spines=4)}


def run(tmp_path, faults, cfg=None, **sim):
    out = tmp_path / "run.c4rec"
    simulate(SimConfig(faults=[Fault.parse(f) for f in faults], **sim), out)
    res = replay(out, cfg=cfg)
    truth = load_truth(out)
    return res, score(truth, res.incidents, clock_origin(out, truth))


def busiest_fabric_link(seed: int, **cfg) -> str:
    """A fabric link the job's traffic crosses (ECMP choices depend on the seed)."""
    job = Simulator(SimConfig(**cfg, seed=seed, realism=False)).jobs[0]
    load: dict[str, int] = {}
    for c in job.conns:
        for lk in c.links:
            if "spine" in lk:
                load[lk] = load.get(lk, 0) + 1
    return max(sorted(load), key=lambda lk: load[lk])


def fault_specs(size: int) -> list[str]:
    g = SIZES[size]["gpus_per_host"]
    h = SIZES[size]["hosts"] // 2
    host, nxt = f"node{h:03d}", f"node{h + 1:03d}"
    return [f"slow-node:{host}@15", f"slow-node:{host}/mlx5_1@15", f"slow-link:{host},{nxt}@15",
            f"lossy-link:{busiest_fabric_link(size, **SIZES[size])}@15", f"hang:{h * g + 1}@15",
            f"nic-down:{host}/mlx5_2@15", f"straggler:{h * g + 2}@15", f"xid:{h * g + 3}@15",
            f"link-flap:{host}/mlx5_0@15", f"pfc-storm:{host}/mlx5_3@15",
            f"aer:{host}/mlx5_1@15", f"host-down:{host}@15",
            # inside a collective: stopped (plugin silent), stuck in a kernel (plugin reports)
            f"sigstop:{h * g + 2}@15", f"kernel-hang:{h * g + 3}@15"]


CASES = [(size, spec) for size in SIZES for spec in fault_specs(size)]


@pytest.mark.parametrize("size, spec", CASES, ids=[f"{s}-{f.split('@')[0]}" for s, f in CASES])
def test_each_fault_is_named(tmp_path, size, spec):
    # a rank that stops calling collectives looks like a checkpoint writer: this job declares
    # it takes none (test_diag_adversarial.py covers the default allowance)
    cfg = AggregatorConfig(diagnosis={"checkpoint_s": 0.0}) if spec.startswith("hang:") else None
    res, sc = run(tmp_path, [spec], cfg=cfg, duration=35, seed=size, **SIZES[size])
    assert sc.named == 1, sc.misses
    assert sc.false_incidents == 0, sc.wrong
    hang_like = spec.split(":")[0] in ("hang", "xid", "nic-down", "host-down", "sigstop",
                                       "kernel-hang")
    assert sc.localise_s[0] <= (10.0 if hang_like else 30.0)
    inc = res.incidents[0]
    assert inc["evidence"] and inc["summary"]
    if spec.startswith(("nic-down", "host-down")):
        # the job hangs too: that symptom joined the incident of its cause (after an Xid the
        # rank idles like a checkpoint writer: the hang shows after the allowance)
        assert set(inc["evidence"].get("symptoms", {})) & {"comm_hang", "noncomm_hang"}, inc
    if spec.startswith(("slow-", "lossy-")):
        m = inc["matrix"]
        r, c = m["focus"]
        assert m["cells"][r][c] > 1.5 * min(v for row in m["cells"] for v in row if v)


def test_clean_small_job_with_restarts_raises_nothing(tmp_path):
    res, sc = run(tmp_path, [], duration=1200, seed=11, restart_at=[300.0, 800.0],
                  noise=0.08, **SIZES[16])
    assert res.incidents == []
    assert [j["comms"][0]["state"] for j in res.jobs] == ["running"]  # the restarted comm
    assert len(res.jobs[0]["comms"]) == 1  # the old one expired


def test_clean_256_ranks_tree_noisy_raises_nothing(tmp_path):
    res, _ = run(tmp_path, [], duration=180, seed=12, collective="tree", noise=0.1,
                 restart_at=[90.0], **SIZES[256])
    assert res.incidents == []
    job = res.jobs[0]
    assert job["ranks"] == 256 and len(job["hosts"]) == 32


def test_two_simultaneous_faults_are_both_found(tmp_path):
    link = busiest_fabric_link(5, **SIZES[256])
    res, sc = run(tmp_path, ["slow-node:node003@12", f"lossy-link:{link}@12",
                             "straggler:200@12"], duration=35, seed=5, **SIZES[256])
    assert sc.named == 3, sc.misses
    assert sc.false_incidents == 0, sc.wrong


def test_faults_are_tied_to_their_job(tmp_path):
    res, sc = run(tmp_path, ["hang:13@15", "slow-node:node001@15"], duration=35, hosts=8,
                  cfg=AggregatorConfig(diagnosis={"checkpoint_s": 0.0}),
                  gpus_per_host=2, leaves=4, spines=2, jobs=2)
    assert sc.named == 2 and sc.false_incidents == 0, (sc.misses, sc.wrong)
    by_class = {i["class"]: i for i in res.incidents}
    assert by_class["noncomm_hang"]["job"] == "train-1"
    assert by_class["noncomm_hang"]["suspects"][0]["rank"] == 5  # rank 5 of job 1 = GPU 13
    assert by_class["comm_slow"]["job"] == "train-0"
    jobs = {j["job"]: j for j in res.jobs}
    assert jobs["train-0"]["hosts"] == ["node000", "node001", "node002", "node003"]
    assert [c["state"] for c in jobs["train-1"]["comms"]] == ["stalled"]
    assert jobs["train-1"]["open_incidents"] == [by_class["noncomm_hang"]["id"]]


def test_a_healed_fault_resolves_its_incident(tmp_path):
    cfg = AggregatorConfig(diagnosis={"resolve_hold_s": 15.0})
    res, sc = run(tmp_path, ["slow-link:node001,node002@10-30"], cfg=cfg, duration=60,
                  **SIZES[16])
    assert sc.named == 1
    (inc,) = res.incidents
    assert inc["state"] == "resolved"
    assert 15.0 <= inc["resolved"] - inc["localised"] <= 15.0 + 20.0 + 5.0


def test_a_healed_nic_resolves_after_it_comes_back(tmp_path):
    cfg = AggregatorConfig(diagnosis={"resolve_hold_s": 10.0})
    res, sc = run(tmp_path, ["nic-down:node002/mlx5_1@10-20"], cfg=cfg, duration=45,
                  **SIZES[16])
    assert sc.named == 1
    assert [i["state"] for i in res.incidents] == ["resolved"]
    assert res.jobs[0]["comms"][0]["state"] == "running"


def test_other_tenants_congestion_and_checkpoints_raise_nothing(tmp_path):
    """A 5 s burst at 3.5x on the job's busiest fabric link (one direction) and a 30 s
    checkpoint where every rank pauses between collectives: noise, not faults."""
    cfg = SimConfig(duration=90, seed=16, realism=False, **SIZES[16])
    sim = Simulator(cfg)
    link = busiest_fabric_link(16, **SIZES[16])
    sim.bursts = [(30.0, 35.0, link, "up", 3.5), (50.0, 55.0, link, "down", 3.5)]
    sim.checkpoints = [(60.0, 90.0, 0)]
    out = tmp_path / "run.c4rec"
    sim.run(out)
    res = replay(out)
    assert res.incidents == [], [i["summary"] for i in res.incidents]

"""`c4 sim` then `c4 replay --json` as real processes, at 2,048 ranks (256 hosts x 8 GPUs on
16 leaves and 8 spines): every fault class is named. Few, short runs, several faults each, so
the diagnosis suite stays within minutes on two cores."""
from __future__ import annotations

import json
import subprocess

import pytest

from c4.lab.evaluate import clock_origin, load_truth, score
from c4.lab.sim import SimConfig, Simulator

from .procs import REPO, c4_cmd, env

CLUSTER = ["--hosts", "256", "--gpus-per-host", "8", "--leaves", "16", "--spines", "8"]


def busy_link(seed: int) -> str:
    """A fabric link the job's traffic crosses (ECMP choices depend on the seed)."""
    job = Simulator(SimConfig(hosts=256, gpus_per_host=8, leaves=16, spines=8, seed=seed,
                              realism=False)).jobs[0]
    load: dict[str, int] = {}
    for c in job.conns:
        for lk in c.links:
            if "spine" in lk and not lk.startswith(("leaf00", "leaf15")):
                load[lk] = load.get(lk, 0) + 1
    return max(sorted(load), key=lambda lk: load[lk])


def sim_and_replay(tmp_path, duration: float, faults: list[str], seed: int = 1):
    out = tmp_path / "big.c4rec"
    args = c4_cmd("sim", *CLUSTER, "--duration", str(duration), "--seed", str(seed),
                  "--out", str(out))
    for f in faults:
        args += ["--fault", f]
    sim = subprocess.run(args, env=env(), cwd=REPO, capture_output=True, text=True, timeout=120)
    assert sim.returncode == 0, sim.stderr
    assert json.loads(sim.stdout)["ranks"] == 2048
    rep = subprocess.run(c4_cmd("replay", str(out), "--json"), env=env(), cwd=REPO,
                         capture_output=True, text=True, timeout=240)
    assert rep.returncode == 0, rep.stderr[-2000:]
    result = json.loads(rep.stdout)
    assert sum(result["stats"]["rejected"].values()) == 0
    truth = load_truth(out)
    return result, score(truth, result["incidents"], clock_origin(out, truth))


@pytest.mark.timeout(400)
def test_slow_straggler_and_hardware_faults_at_2048_ranks(tmp_path):
    # the job computes from ~10 s on (ranks join over up to 8 s, then NCCL init)
    faults = ["slow-node:node010@12", f"lossy-link:{busy_link(1)}@12", "straggler:801@12",
              "pfc-storm:node150/mlx5_3@12", "link-flap:node200/mlx5_0@12",
              "aer:node220/mlx5_1@12", "xid:1925@26"]
    result, sc = sim_and_replay(tmp_path, 40, faults)
    assert sc.named == len(faults), sc.misses
    assert sc.false_incidents == 0 and sc.false_isolations == 0, sc.wrong
    hang = [i for i in result["incidents"] if i["class"] == "hw_xid"][0]
    assert "noncomm_hang" in hang["evidence"]["symptoms"]  # the job hung on the dead GPU
    (job,) = result["jobs"]
    assert job["ranks"] == 2048 and len(job["hosts"]) == 256


@pytest.mark.timeout(400)
def test_hangs_and_a_dead_nic_at_2048_ranks(tmp_path):
    result, sc = sim_and_replay(tmp_path, 22, ["hang:961@12", "host-down:node180@12"], seed=2)
    assert sc.named == 2, sc.misses
    assert sc.false_incidents == 0, sc.wrong
    assert max(sc.localise_s) <= 10.0
    result, sc = sim_and_replay(tmp_path, 20, ["nic-down:node050/mlx5_2@12"], seed=3)
    assert sc.named == 1, sc.misses
    assert sc.false_incidents == 0, sc.wrong
    (inc,) = result["incidents"]
    assert inc["class"] == "hw_nic_down" and "comm_hang" in inc["evidence"]["symptoms"]

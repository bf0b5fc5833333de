"""Issue 4 end to end: the NCCL plugin (driven by its C harness exactly as NCCL drives it)
-> a real agent (Unix datagrams) -> a real aggregator (ZeroMQ) -> `c4 host NAME --json`."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path


from .procs import REPO, Cluster, wait_for

HARNESS = REPO / "plugin" / "build" / "harness"
HOST = "gpu-nccl-01"
COMM = "00000000c4c4beef"


def _comms(cluster: Cluster) -> list[dict]:
    out = cluster.cli("host", HOST, "--json")
    assert out.returncode == 0, out.stderr
    return (json.loads(out.stdout).get("report") or {}).get("nccl", {}).get("comms", [])


def test_plugin_summaries_reach_the_aggregator(cluster: Cluster, tmp_path: Path) -> None:
    subprocess.run(["make", "-s", "-C", str(REPO / "plugin")], check=True, timeout=300)
    assert HARNESS.exists(), "plugin/Makefile did not build the harness"
    sysfs = REPO / "tests" / "fixtures" / "sysfs" / "mlx5_2port"
    cluster.start_aggregator()
    agent = cluster.start_agent(HOST, sysfs, interval=0.5, collectors=("host", "nccl"))
    sock = tmp_path / f"run-{HOST}" / "plugin.sock"
    wait_for(sock.exists, what="the agent's plugin socket")

    env = dict(os.environ, C4_AGENT_SOCKET=str(sock), C4_INTERVAL_MS="200",
               C4_STALL_MS="500")
    harness = subprocess.Popen(
        [str(HARNESS), "--emit-only", "--seconds", "8", "--ranks", "8", "--comm", COMM],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def all_ranks_moving() -> list[dict] | None:
            comms = [c for c in _comms(cluster) if c["comm"] == COMM]
            if {c["rank"] for c in comms} != set(range(8)):
                return None
            # Each rank sends to its ring successor and receives from its predecessor.
            if not all(any(p["dir"] == "send" and p["bytes"] > 0 for p in c["peers"])
                       for c in comms):
                return None
            return comms

        comms = wait_for(all_ranks_moving, timeout=30, what="traffic summaries of all 8 ranks")
        human = cluster.cli("host", HOST)  # while the workload runs: summaries are current
    finally:
        out, _ = harness.communicate(timeout=60)
    assert harness.returncode == 0, out
    for c in comms:
        assert c["nranks"] == 8 and c["seq_completed"] > 0
        assert c["pid"] == harness.pid  # the kernel-reported sender (SO_PASSCRED)
        sends = {p["peer"] for p in c["peers"] if p["dir"] == "send"}
        assert sends == {(c["rank"] + 1) % 8}
    assert human.returncode == 0 and "NCCL communicators" in human.stdout
    assert COMM in human.stdout
    assert agent.p.poll() is None  # the agent is still running

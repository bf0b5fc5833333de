"""Job id and GPU of a process from its environment, on fixture /proc trees."""
from __future__ import annotations

from pathlib import Path

import pytest

from c4.agent.jobs import JobResolver


def _proc(root: Path, pid: int, env: dict[str, str], start: int = 12345) -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "stat").write_text(f"{pid} (python3 x y) S " + " ".join(["0"] * 18 + [str(start)] + ["0"] * 10) + "\n")
    (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items()))


@pytest.mark.parametrize("env,dev", [
    ({"CUDA_VISIBLE_DEVICES": "5", "LOCAL_RANK": "0"}, 5),  # one visible GPU: that one
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3", "LOCAL_RANK": "2"}, 2),  # all visible: local rank
    ({"SLURM_LOCALID": "7"}, 7),
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "3"}, 3),
    ({"CUDA_VISIBLE_DEVICES": "GPU-4b1a2c3d"}, None),  # a UUID names no index
    ({"LOCAL_RANK": "-1"}, None),
    ({"LOCAL_RANK": "999"}, None),  # beyond what the wire carries
    ({}, None),
])
def test_device_of_a_process(tmp_path: Path, env: dict[str, str], dev: int | None) -> None:
    _proc(tmp_path, 100, {"SLURM_JOB_ID": "42", **env})
    r = JobResolver(tmp_path)
    assert r.lookup(100) == ("42", dev)
    assert r.job_of(100) == "42"


def test_a_recycled_pid_is_read_again(tmp_path: Path) -> None:
    _proc(tmp_path, 100, {"SLURM_JOB_ID": "1", "LOCAL_RANK": "1"}, start=1)
    r = JobResolver(tmp_path)
    assert r.lookup(100) == ("1", 1)
    _proc(tmp_path, 100, {"SLURM_JOB_ID": "2", "LOCAL_RANK": "4"}, start=2)
    assert r.lookup(100) == ("2", 4)

"""tcp_flows options: every bad value is an OptionError naming the key."""
from __future__ import annotations

from pathlib import Path

import pytest

from c4.agent.collectors.base import CollectorUnavailable, OptionError
from c4.agent.collectors.tcp_flows import Options, cgroup_target, parse_options


def test_defaults() -> None:
    opts = parse_options({})
    assert opts == Options()
    assert (opts.max_flows, opts.max_report_flows, opts.refresh_intervals) == (16384, 2048, 30)
    assert not opts.owner_filter


def test_valid_values_are_normalised() -> None:
    opts = parse_options({"ports": [29500, 80, 29500], "pids": [7], "cgroup": "/sys/fs/cg/",
                          "max_flows": 64, "max_report_flows": 1, "retrans_burst": 0,
                          "max_events": 0, "refresh_intervals": 1})
    assert opts.ports == (80, 29500)
    assert opts.pids == (7,)
    assert opts.cgroup == "/sys/fs/cg"
    assert opts.owner_filter


@pytest.mark.parametrize("key, value", [
    ("ports", 29500),
    ("ports", [0]),
    ("ports", [65536]),
    ("ports", [True]),
    ("ports", ["29500"]),
    ("pids", [-1]),
    ("pids", list(range(1, 1026))),
    ("cgroup", "relative/path"),
    ("cgroup", 5),
    ("max_flows", 10),
    ("max_flows", 1 << 21),
    ("max_report_flows", 0),
    ("max_report_flows", 3001),
    ("retrans_burst", -1),
    ("max_events", "many"),
    ("refresh_intervals", 0),
    ("refresh_intervals", 86401),
    ("max_flow", 100),
])
def test_bad_values_name_the_key(key: str, value: object) -> None:
    with pytest.raises(OptionError, match=rf"collectors\.tcp_flows\.{key}"):
        parse_options({key: value})


def test_cgroup_level_and_id_from_mountinfo(tmp_path: Path) -> None:
    job = tmp_path / "slurm" / "job_7"
    job.mkdir(parents=True)
    mountinfo = (f"31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
                 f"35 31 0:32 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
                 f"41 31 0:38 / {tmp_path} rw,relatime - cgroup2 cgroup2 rw\n")
    assert cgroup_target(str(job), mountinfo) == (job.stat().st_ino, 2)
    assert cgroup_target(str(tmp_path), mountinfo) == (tmp_path.stat().st_ino, 0)


def test_cgroup_outside_cgroup2_or_missing_is_unavailable(tmp_path: Path) -> None:
    v1 = f"35 31 0:32 / {tmp_path} rw - cgroup cgroup rw,memory\n"
    with pytest.raises(CollectorUnavailable, match="not on a cgroup v2 mount"):
        cgroup_target(str(tmp_path), v1)
    v2 = f"41 31 0:38 / {tmp_path} rw - cgroup2 cgroup2 rw\n"
    with pytest.raises(CollectorUnavailable, match="No such file"):
        cgroup_target(str(tmp_path / "gone"), v2)

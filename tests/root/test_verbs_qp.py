"""The verbs_qp collector with its eBPF uprobes really loaded, attached to the verbs test
library (real ABI and symbol versions) and watching qp_driver create, modify and destroy QPs."""
from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterator

import pytest

from c4.agent.collectors import CollectorUnavailable, Context
from c4.agent.collectors.verbs_qp import VerbsQpCollector
from c4.core.roce import rdma_flow_label_to_udp_sport, sport_for_qp
from tests.verbs import harness
from tests.wire_check import validate_section

DGID = "0000:0000:0000:0000:0000:ffff:0a00:0002"  # ::ffff:10.0.0.2


@pytest.fixture(scope="module")
def built() -> None:
    harness.require("all")


@pytest.fixture
def start(built: None, tmp_path: Path) -> Iterator[Callable[..., VerbsQpCollector]]:
    """Start a collector on the test library; an empty sysfs root: no RDMA devices."""
    started: list[VerbsQpCollector] = []

    def _start(sysfs_root: Path = tmp_path, **options: object) -> VerbsQpCollector:
        c = VerbsQpCollector(Context(host="test", sysfs_root=sysfs_root),
                             {"library": str(harness.LIBRARY), **options})
        c.start()
        started.append(c)
        return c

    try:
        yield _start
    finally:
        for c in started:
            c.close()


@pytest.fixture
def drivers() -> Iterator[Callable[[], harness.Driver]]:
    running: list[harness.Driver] = []

    def _new() -> harness.Driver:
        running.append(harness.Driver())
        return running[-1]

    try:
        yield _new
    finally:
        for d in running:
            d.close()


def collect(c: VerbsQpCollector) -> dict:
    section = c.collect(0.0).section
    validate_section("verbs_qp", section)
    return section


def by_qpn(section: dict, pid: int) -> dict[int, dict]:
    return {q["lqpn"]: q for q in section["qps"] if q["pid"] == pid}


def test_nccl_like_qp_lifecycle_and_predicted_port(start, drivers) -> None:
    c = start()
    d = drivers()
    d.ok("create 0x1fd2 RC")
    d.ok("modify 0x1fd2 INIT")
    d.ok("modify 0x1fd2 RTR 0x423c 0 10.0.0.2")
    d.ok("modify 0x1fd2 RTS")
    d.ok("create 0x100 RC")  # the application chose a flow label: the port follows it
    d.ok("modify 0x100 INIT")
    d.ok("modify 0x100 RTR 0x200 0x12345 10.0.0.3")
    d.ok("modify 0x100 RTS")
    d.ok("create 0x300 RC")
    assert d.send("modify 0x300 RTS").startswith("err")  # RESET -> RTS is refused

    qps = by_qpn(collect(c), d.pid)
    assert set(qps) == {0x1FD2, 0x100, 0x300}
    nccl = qps[0x1FD2]
    assert (nccl["rqpn"], nccl["state"], nccl["qp_type"], nccl["port"]) == (0x423C, "RTS", "RC", 1)
    assert (nccl["dgid"], nccl["flow_label"], nccl["sport"]) == (DGID, 0, 55701)
    assert (nccl["comm"], nccl["destroyed"], nccl["modifies"]) == ("qp_driver", False, 3)
    chosen = qps[0x100]
    assert chosen["sport"] == rdma_flow_label_to_udp_sport(0x12345)
    assert chosen["sport"] != sport_for_qp(0x100, 0x200, 0) == 49160
    refused = qps[0x300]
    assert (refused["state"], refused["modify_failed"], refused["rqpn"]) == ("RESET", 1, None)

    d.ok("destroy 0x1fd2")
    section = collect(c)
    qps = by_qpn(section, d.pid)
    assert qps[0x1FD2]["destroyed"] is True and "exited" not in qps[0x1FD2]
    stats = section["stats"]
    assert (stats["creates"], stats["modifies"], stats["modify_failed"], stats["destroys"]) == (
        3, 6, 1, 1)
    section = collect(c)
    assert 0x1FD2 not in by_qpn(section, d.pid)  # reported once, then evicted
    assert not any(q["destroyed"] for q in section["qps"])


def test_process_exit_without_destroy_is_reported_once(start, drivers) -> None:
    c = start()
    d = drivers()
    d.ok("create 0x777 RC")
    d.ok("modify 0x777 INIT")
    assert by_qpn(collect(c), d.pid)[0x777]["state"] == "INIT"
    assert d.close() == 0
    gone = by_qpn(collect(c), d.pid)[0x777]
    assert gone["destroyed"] is True and gone["exited"] is True
    assert by_qpn(collect(c), d.pid) == {}


def test_pid_filter_and_qps_created_before_start(start, drivers) -> None:
    mine, other = drivers(), drivers()
    mine.ok("create 0x1fd2 RC")  # before the collector: learned at its next modify
    c = start(pids=[mine.pid])
    for d in (mine, other):
        if d is other:
            d.ok("create 0x1fd2 RC")
        d.ok("modify 0x1fd2 INIT")
        d.ok("modify 0x1fd2 RTR 0x423c 0 10.0.0.2")
    section = collect(c)
    assert {q["pid"] for q in section["qps"]} == {mine.pid}
    qp = by_qpn(section, mine.pid)[0x1FD2]
    assert (qp["state"], qp["sport"], qp["modifies"]) == ("RTR", 55701, 2)
    assert section["stats"]["creates"] == 0


def test_netlink_listing_when_devices_exist(start, fixtures: Path, tmp_path: Path) -> None:
    sysfs = tmp_path / "sys"
    (sysfs / "class/infiniband/mlx5_0").mkdir(parents=True)
    c = start(sysfs_root=sysfs, rdma_command=["cat", str(fixtures / "rdma/res_qp_mlx5.json")])
    section = collect(c)
    assert [(q["dev"], q["lqpn"], q["state"]) for q in section["netlink"][:3]] == [
        ("mlx5_0", 1, "RTS"), ("mlx5_0", 0x1FD2, "RTS"), ("mlx5_0", 0x1FD3, "ERR")]
    broken = start(sysfs_root=sysfs, rdma_command=["false"])
    section = collect(broken)
    assert "netlink" not in section and "exited 1" in section["netlink_error"]
    assert section["stats"]["netlink_errors"] == 1


def test_library_without_the_verbs_is_unavailable(built: None) -> None:
    c = VerbsQpCollector(Context(host="test"), {"library": str(harness.DRIVER)})
    with pytest.raises(CollectorUnavailable, match="does not export a default version"):
        c.start()
    c = VerbsQpCollector(Context(host="test"), {"library": "/nonexistent/libibverbs.so.1"})
    with pytest.raises(CollectorUnavailable, match="does not exist"):
        c.start()

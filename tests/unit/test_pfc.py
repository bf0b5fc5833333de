"""The pfc collector with ethtool statistics injected from `ethtool -S` captures of an mlx5
(tests/fixtures/ethtool) and RDMA ports from the fixture sysfs trees."""
from __future__ import annotations

import errno
import logging
import os
import re
from pathlib import Path
from typing import Callable

import pytest

from c4.agent.collectors import OptionError, load
from c4.agent.collectors.base import Context
from c4.agent.collectors.pfc import PAUSE_STAT, PfcCollector
from c4.agent.ethtool import EthtoolError
from tests.wire_check import validate_sample


def parse_ethtool_s(text: str) -> dict[str, int]:
    """`ethtool -S` output: a `NIC statistics:` header, then `     name: value` lines."""
    lines = text.splitlines()
    assert lines[0] == "NIC statistics:"
    out = {}
    for line in lines[1:]:
        m = re.fullmatch(r" {5}([^:]+): (\d+)", line)
        assert m, line
        out[m.group(1)] = int(m.group(2))
    return out


def stats(fixtures: Path, name: str) -> dict[str, int]:
    return parse_ethtool_s((fixtures / "ethtool" / name).read_text())


class Reader:
    """A stats reader serving a fixture per netdev; a netdev mapped to an errno fails."""

    def __init__(self, table: dict[str, dict[str, int] | int]) -> None:
        self.table = table
        self.calls: list[str] = []

    def __call__(self, netdev: str) -> dict[str, int]:
        self.calls.append(netdev)
        value = self.table.get(netdev, errno.ENODEV)
        if isinstance(value, int):
            raise EthtoolError(value, f"{netdev}: {os.strerror(value)}")
        return value


def make(root: Path, reader: Callable, **options) -> PfcCollector:
    c = PfcCollector(Context("h1", sysfs_root=root), options, stats_reader=reader)
    c.start()
    return c


def valid(sample) -> None:
    validate_sample("pfc", sample)


def test_registered_under_its_name():
    assert load("pfc") is PfcCollector


def test_fixture_has_the_mlx5_pause_counters(fixtures):
    s = stats(fixtures, "mlx5_cx7.txt")
    kept = {k for k in s if PAUSE_STAT.fullmatch(k)}
    assert {"rx_prio3_pause", "tx_prio3_pause", "rx_prio3_pause_duration",
            "tx_prio3_pause_duration", "rx_prio3_pause_transition",
            "tx_pause_storm_warning_events", "tx_pause_storm_error_events",
            "rx_pause_ctrl_phy", "tx_pause_ctrl_phy"} == kept
    assert "rx_prio3_bytes" in s and "rx_prio3_bytes" not in kept


def test_rdma_ports_map_to_netdevs_with_deltas_and_storm_events(fixtures):
    a, b = stats(fixtures, "mlx5_cx7.txt"), stats(fixtures, "mlx5_cx7_storm.txt")
    table: dict = {"ens1f0np0": a, "ens1f1np1": a, "ens2f0np0": a, "ens2f1np1": a}
    reader = Reader(table)
    c = make(fixtures / "sysfs/mlx5_2dev", reader)
    first = c.collect(100.0)
    valid(first)
    entries = {e["netdev"]: e for e in first.section["netdevs"]}
    assert set(entries) == set(table)
    assert (entries["ens2f1np1"]["dev"], entries["ens2f1np1"]["port"]) == ("mlx5_1", 2)
    pause = {k: v for k, v in a.items() if PAUSE_STAT.fullmatch(k)}
    assert entries["ens1f0np0"]["counters"] == pause
    assert "deltas" not in entries["ens1f0np0"] and first.events == []

    table["ens2f1np1"] = b  # the storm hits one NIC
    s = c.collect(110.0)
    valid(s)
    e = {x["netdev"]: x for x in s.section["netdevs"]}["ens2f1np1"]
    for name in e["counters"]:
        assert e["deltas"][name] == b[name] - a[name]
        assert e["rates"][name] == pytest.approx((b[name] - a[name]) / 10.0)
    assert e["deltas"]["rx_prio3_pause"] > 0
    events = {ev.type: ev for ev in s.events}
    assert set(events) == {"pause_storm", "pause_storm_warning"}
    storm = events["pause_storm"]
    assert storm.severity == "error" and storm.device == "ens2f1np1"
    assert storm.attrs["counter"] == "tx_pause_storm_error_events"
    assert storm.attrs["delta"] == (b["tx_pause_storm_error_events"]
                                    - a["tx_pause_storm_error_events"])
    assert (storm.attrs["dev"], storm.attrs["port"]) == ("mlx5_1", 2)
    warn = events["pause_storm_warning"]
    assert warn.severity == "warning" and warn.attrs["delta"] == (
        b["tx_pause_storm_warning_events"] - a["tx_pause_storm_warning_events"])
    others = [x for x in s.section["netdevs"] if x["netdev"] != "ens2f1np1"]
    assert all(set(x["deltas"].values()) == {0} for x in others)


def test_counter_reset_is_flagged(fixtures):
    a, b = stats(fixtures, "mlx5_cx7.txt"), stats(fixtures, "mlx5_cx7_storm.txt")
    table: dict = {"eth0": b}
    c = make(fixtures / "sysfs/mlx5_2dev", Reader(table), netdevs=["eth0"])
    c.collect(1.0)
    table["eth0"] = a  # counters went back: driver reload
    e = c.collect(2.0).section["netdevs"][0]
    assert "rx_prio3_pause" in e["resets"] and e["deltas"]["rx_prio3_pause"] == a["rx_prio3_pause"]
    assert "dev" not in e  # listed in config, not found through an RDMA port


def test_failing_netdev_is_reported_once_and_others_go_on(fixtures, caplog):
    a = stats(fixtures, "mlx5_cx7.txt")
    table: dict = {"ens1f0np0": a, "ens1f1np1": errno.EOPNOTSUPP, "ens2f0np0": a,
                   "ens2f1np1": a}
    c = make(fixtures / "sysfs/mlx5_2dev", Reader(table))
    with caplog.at_level(logging.WARNING, logger="c4.agent"):
        for t in (1.0, 2.0, 3.0):
            s = c.collect(t)
            valid(s)
    assert [x["netdev"] for x in s.section["netdevs"]] == ["ens1f0np0", "ens2f0np0", "ens2f1np1"]
    assert list(s.section["unavailable"]) == ["ens1f1np1"]
    assert s.section["unavailable"]["ens1f1np1"] == f"ens1f1np1: {os.strerror(errno.EOPNOTSUPP)}"
    assert sum("ens1f1np1" in r.getMessage() for r in caplog.records) == 1
    table["ens1f1np1"] = a  # driver back
    s = c.collect(4.0)
    assert "unavailable" not in s.section
    assert "deltas" not in {x["netdev"]: x for x in s.section["netdevs"]}["ens1f1np1"]


def test_infiniband_ports_are_skipped(fixtures):
    reader = Reader({})
    s = make(fixtures / "sysfs/old_hca", reader).collect(1.0)
    assert s.section == {"netdevs": []} and reader.calls == []


def test_no_rdma_no_netdevs(tmp_path):
    s = make(tmp_path, Reader({})).collect(1.0)
    assert s.section == {"netdevs": []}
    valid(s)


def test_netdev_without_pause_counters(fixtures):
    veth = {"peer_ifindex": 7, "rx_queue_0_xdp_packets": 3, "tx_queue_0_xdp_xmit": 0}
    c = make(fixtures / "sysfs/mlx5_2port", Reader({"v0": veth}), netdevs=["v0"])
    c.collect(1.0)
    s = c.collect(2.0)
    valid(s)
    assert s.section["netdevs"] == [{"netdev": "v0", "counters": {}, "deltas": {}, "rates": {},
                                     "resets": []}]


@pytest.mark.parametrize("options,key", [
    ({"netdevs": "eth0"}, "collectors.pfc.netdevs"),
    ({"netdevs": ["eth0", ""]}, "collectors.pfc.netdevs"),
    ({"netdevs": ["a" * 16]}, "collectors.pfc.netdevs"),
    ({"netdevs": ["bad name"]}, "collectors.pfc.netdevs"),
    ({"netdev": ["eth0"]}, "collectors.pfc.netdev"),
])
def test_bad_options_name_the_key(options, key):
    with pytest.raises(OptionError, match=key.replace(".", r"\.")):
        PfcCollector(Context("h1"), options)

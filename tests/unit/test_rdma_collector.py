"""The rdma collector on copies of the fixture sysfs trees that the tests then edit."""
from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from c4.agent.collectors import OptionError, load
from c4.agent.collectors.base import Context
from c4.agent.collectors.rdma import RdmaCollector
from c4.core.catalog import COUNTER_SCALE, NODE_EXPORTER_METRICS
from c4.core.wire import kinds
from tests.wire_check import validate_sample


def copy_tree(fixtures: Path, name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(fixtures / "sysfs" / name, dst, symlinks=True)
    return dst


def port_dir(root: Path, dev: str, port: int) -> Path:
    return root / "class/infiniband" / dev / "ports" / str(port)


def counter_file(root: Path, dev: str, port: int, name: str) -> Path:
    p = port_dir(root, dev, port)
    return p / "counters" / name if (p / "counters" / name).exists() else p / "hw_counters" / name


def read_counter(root: Path, dev: str, port: int, name: str) -> int:
    return int(counter_file(root, dev, port, name).read_text())


def write_counter(root: Path, dev: str, port: int, name: str, value: int) -> None:
    counter_file(root, dev, port, name).write_text(f"{value}\n")


def bump(root: Path, dev: str, port: int, name: str, by: int) -> None:
    write_counter(root, dev, port, name, read_counter(root, dev, port, name) + by)


def collector(root: Path, **options) -> RdmaCollector:
    c = RdmaCollector(Context("h1", sysfs_root=root), options)
    c.start()
    return c


def by_port(sample) -> dict:
    return {(p["dev"], p["port"]): p for p in sample.section["ports"]}


def valid_report(sample) -> None:
    validate_sample("rdma", sample)


def test_registered_under_its_name():
    assert load("rdma") is RdmaCollector


def test_first_sample_has_raw_counters_and_no_deltas(fixtures):
    root = fixtures / "sysfs/mlx5_2dev"
    s = collector(root).collect(1000.0)
    valid_report(s)
    ports = by_port(s)
    assert set(ports) == {("mlx5_0", 1), ("mlx5_0", 2), ("mlx5_1", 1), ("mlx5_1", 2)}
    p = ports[("mlx5_1", 2)]
    assert p["counters"]["np_ecn_marked_roce_packets"] == read_counter(
        root, "mlx5_1", 2, "np_ecn_marked_roce_packets")
    assert p["state"] == "ACTIVE" and p["phys_state"] == "LinkUp" and p["rate_gbps"] == 400.0
    assert p["netdev"] == "ens2f1np1" and p["pci"] == "0000:5e:00.0"
    assert "deltas" not in p and "rates" not in p
    assert s.events == []


def test_deltas_and_rates_follow_written_values(fixtures, tmp_path):
    root = copy_tree(fixtures, "mlx5_2dev", tmp_path)
    c = collector(root)
    c.collect(1000.0)
    bumps = {"port_xmit_data": 250_000_000, "port_rcv_data": 125_000_000,
             "np_cnp_sent": 4321, "rp_cnp_handled": 17, "out_of_sequence": 3,
             "local_ack_timeout_err": 2}
    before = {n: read_counter(root, "mlx5_0", 2, n) for n in bumps}
    for n, d in bumps.items():
        write_counter(root, "mlx5_0", 2, n, before[n] + d)
    s = c.collect(1002.5)
    valid_report(s)
    p = by_port(s)[("mlx5_0", 2)]
    dt = 2.5
    for n, d in bumps.items():
        assert p["deltas"][n] == d
        assert p["rates"][n] == pytest.approx(d / dt)
        assert p["counters"][n] == before[n] + d
    assert p["rates"]["port_xmit_bytes"] == pytest.approx(4 * bumps["port_xmit_data"] / dt)
    assert p["rates"]["port_rcv_bytes"] == pytest.approx(4 * bumps["port_rcv_data"] / dt)
    untouched = set(p["counters"]) - set(bumps)
    assert all(p["deltas"][n] == 0 for n in untouched)
    assert p["resets"] == []
    assert all(v == 0 for v in by_port(s)[("mlx5_1", 1)]["deltas"].values())


def test_counter_going_backwards_is_a_reset(fixtures, tmp_path):
    root = copy_tree(fixtures, "mlx5_2port", tmp_path)
    c = collector(root)
    c.collect(10.0)
    old = read_counter(root, "mlx5_0", 1, "rp_cnp_handled")
    write_counter(root, "mlx5_0", 1, "rp_cnp_handled", old // 100)  # driver reload
    bump(root, "mlx5_0", 1, "port_xmit_data", 10)
    p = by_port(c.collect(11.0))[("mlx5_0", 1)]
    assert p["resets"] == ["rp_cnp_handled"]
    assert p["deltas"]["rp_cnp_handled"] == old // 100
    assert p["deltas"]["port_xmit_data"] == 10


def test_state_transition_and_link_flap_events(fixtures, tmp_path):
    root = copy_tree(fixtures, "mlx5_2port", tmp_path)
    p1 = port_dir(root, "mlx5_0", 1)
    (p1 / "state").write_text("1: DOWN\n")
    (p1 / "phys_state").write_text("3: Disabled\n")
    c = collector(root)
    first = c.collect(1.0)
    assert by_port(first)[("mlx5_0", 1)]["state"] == "DOWN" and first.events == []

    (p1 / "state").write_text("4: ACTIVE\n")
    (p1 / "phys_state").write_text("5: LinkUp\n")
    bump(root, "mlx5_0", 1, "link_downed", 2)
    s = c.collect(2.0)
    valid_report(s)
    types = {e.type: e for e in s.events}
    assert set(types) == {"port_state", "link_flap"}
    assert types["port_state"].attrs == {"dev": "mlx5_0", "port": 1, "from": "DOWN", "to": "ACTIVE"}
    assert types["port_state"].severity == "info" and types["port_state"].device == "mlx5_0"
    assert types["link_flap"].attrs["count"] == 2 and types["link_flap"].attrs["port"] == 1
    assert types["link_flap"].attrs["netdev"] == "eth0"

    (p1 / "state").unlink()  # unreadable for an interval: no event, state UNKNOWN
    s = c.collect(2.5)
    assert s.events == [] and by_port(s)[("mlx5_0", 1)]["state"] == "UNKNOWN"
    (p1 / "state").write_text("1: DOWN\n")
    (ev,) = c.collect(3.0).events
    assert (ev.type, ev.severity, ev.attrs["from"], ev.attrs["to"]) == ("port_state", "error",
                                                                       "ACTIVE", "DOWN")
    assert c.collect(4.0).events == []  # no change, no event


def test_ports_appearing_and_disappearing(fixtures, tmp_path):
    root = copy_tree(fixtures, "mlx5_2dev", tmp_path)
    link = root / "class/infiniband/mlx5_1"
    target = link.readlink()
    link.unlink()  # device unbound
    c = collector(root)
    assert {k[0] for k in by_port(c.collect(1.0))} == {"mlx5_0"}
    link.symlink_to(target)
    s = c.collect(2.0)
    valid_report(s)
    assert sorted((e.type, e.attrs["dev"], e.attrs["port"]) for e in s.events) == [
        ("port_added", "mlx5_1", 1), ("port_added", "mlx5_1", 2)]
    assert "deltas" not in by_port(s)[("mlx5_1", 1)]  # first sample of the new port
    assert "deltas" in by_port(s)[("mlx5_0", 1)]
    shutil.rmtree(port_dir(root, "mlx5_0", 2))
    s = c.collect(3.0)
    valid_report(s)
    assert [(e.type, e.attrs) for e in s.events] == [
        ("port_removed", {"dev": "mlx5_0", "port": 2})]
    assert ("mlx5_0", 2) not in by_port(s)


def test_unreadable_counter_is_skipped_and_reported(fixtures, tmp_path):
    root = copy_tree(fixtures, "mlx5_2port", tmp_path)
    c = collector(root)
    c.collect(1.0)
    counter_file(root, "mlx5_0", 2, "packet_seq_err").write_text("EIO\n")
    bump(root, "mlx5_0", 2, "np_cnp_sent", 5)
    s = c.collect(2.0)
    valid_report(s)
    p = by_port(s)[("mlx5_0", 2)]
    assert p["unreadable"] == ["packet_seq_err"]
    assert "packet_seq_err" not in p["counters"] and "packet_seq_err" not in p["deltas"]
    assert p["deltas"]["np_cnp_sent"] == 5


def test_host_without_infiniband_reports_empty_ports(tmp_path):
    c = collector(tmp_path)
    s = c.collect(1.0)
    assert s.section == {"ports": []} and s.events == []
    valid_report(s)
    assert c.inventory() == {"nics": []}


def test_old_hca_without_hw_counters(fixtures):
    s = collector(fixtures / "sysfs/old_hca").collect(1.0)
    valid_report(s)
    ports = by_port(s)
    assert ports[("mlx4_0", 1)]["link_layer"] == "InfiniBand"
    assert ports[("mlx4_0", 2)]["state"] == "DOWN"
    assert "np_cnp_sent" not in ports[("mlx4_0", 1)]["counters"]
    assert "port_xmit_data" in ports[("mlx4_0", 1)]["counters"]


def test_inventory_matches_hello_schema_with_rails(fixtures):
    root = fixtures / "sysfs/mlx5_2dev"
    c = collector(root, rails={"mlx5_0": 0, "mlx5_1": 5})
    inv = c.inventory()
    for nic in inv["nics"]:
        kinds.INV_NIC.check(nic)
    hello = {"agent_version": "t", "interval": 1.0, "collectors": {}, **inv}
    kinds.validate_body("hello", hello)
    nics = {n["dev"]: n for n in inv["nics"]}
    dev1 = root / "class/infiniband/mlx5_1"
    assert nics["mlx5_1"]["fw_ver"] == (dev1 / "fw_ver").read_text().strip()
    assert nics["mlx5_1"]["node_guid"] == (dev1 / "node_guid").read_text().strip()
    ports = {p["port"]: p for p in nics["mlx5_1"]["ports"]}
    assert ports[2]["rail"] == 5 and ports[2]["netdev"] == "ens2f1np1"
    assert ports[2]["gids"][0] == (dev1 / "ports/2/gids/0").read_text().strip()
    assert ports[2]["link_layer"] == "Ethernet" and ports[2]["rate_gbps"] == 400.0
    assert all(p["rail"] is None for p in collector(fixtures / "sysfs/old_hca").inventory()
               ["nics"][0]["ports"])


@pytest.mark.parametrize("options,key", [
    ({"rails": {"mlx5_0": -1}}, "collectors.rdma.rails.mlx5_0"),
    ({"rails": {"mlx5_0": "a"}}, "collectors.rdma.rails.mlx5_0"),
    ({"rails": [1]}, "collectors.rdma.rails"),
    ({"rail": {}}, "collectors.rdma.rail"),
])
def test_bad_options_name_the_key(options, key):
    with pytest.raises(OptionError, match=key.replace(".", r"\.")):
        RdmaCollector(Context("h1", log=logging.getLogger("t")), options)


def test_node_exporter_names_cover_the_ib_counters(fixtures):
    ref_counters = {p.name for p in (port_dir(fixtures / "sysfs/old_hca", "mlx4_0", 1)
                                     / "counters").iterdir()}
    assert ref_counters <= set(NODE_EXPORTER_METRICS)
    assert all(m.startswith("node_infiniband_") and m.endswith("_total")
               for m in NODE_EXPORTER_METRICS.values())
    assert (NODE_EXPORTER_METRICS["port_xmit_data"]
            == "node_infiniband_port_data_transmitted_bytes_total")
    assert set(COUNTER_SCALE) == {"port_xmit_data", "port_rcv_data"}


def test_inventory_carries_each_nics_pci_address(fixtures):
    nics = {n["dev"]: n for n in collector(fixtures / "sysfs/mlx5_2dev").inventory()["nics"]}
    assert nics["mlx5_1"]["pci"] == "0000:5e:00.0"


def test_an_over_long_board_id_is_cut_not_the_hello(fixtures, tmp_path):
    """procfs' real hfi1_0 fixture has this 72-character board_id; the wire takes 64. The
    whole hello used to fail validation, so the agent dropped every hello, forever."""
    root = tmp_path / "sys"
    shutil.copytree(fixtures / "sysfs/mlx5_2dev", root, symlinks=True)
    long_id = "HPE 100Gb 1-port OP101 QSFP28 x16 PCIe Gen3 with Intel Omni-Path Adapter"
    (root / "class/infiniband/mlx5_0/board_id").write_text(long_id + "\n")
    inv = collector(root).inventory()
    kinds.validate_body("hello", {"agent_version": "t", "interval": 1.0, "collectors": {}, **inv})
    nics = {n["dev"]: n for n in inv["nics"]}
    assert nics["mlx5_0"]["board_id"] == long_id[:64]
    assert inv["inventory_truncated"] == 1

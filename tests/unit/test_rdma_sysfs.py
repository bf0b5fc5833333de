"""agent/rdma_sysfs.py against the fixture trees (tests/fixtures/sysfs, mlx5 layouts)."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from c4.agent import rdma_sysfs as sysfs


def copy_tree(fixtures: Path, name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(fixtures / "sysfs" / name, dst, symlinks=True)  # keep sysfs's links
    return dst


def port_dir(root: Path, dev: str, port: int) -> Path:
    return root / "class/infiniband" / dev / "ports" / str(port)


@pytest.mark.parametrize("text,state", [("4: ACTIVE", "ACTIVE"), ("1: DOWN", "DOWN"),
                                        ("5: LinkUp", "LinkUp"), ("3: Disabled", "Disabled"),
                                        ("ACTIVE", "ACTIVE"), ("", None), (None, None)])
def test_parse_state(text, state):
    assert sysfs.parse_state(text) == state


@pytest.mark.parametrize("text,rate", [("200 Gb/sec (4X HDR)", 200.0), ("2.5 Gb/sec (1X SDR)", 2.5),
                                       ("400 Gb/sec (4X NDR)", 400.0), ("garbage", None),
                                       (None, None)])
def test_parse_rate(text, rate):
    assert sysfs.parse_rate(text) == rate


def test_symlinked_devices_are_found_with_their_pci_address(fixtures):
    root = fixtures / "sysfs/mlx5_2dev"
    devs = sysfs.list_devices(root)
    assert [d.name for d in devs] == ["mlx5_0", "mlx5_1"]
    assert all((root / "class/infiniband" / d.name).is_symlink() for d in devs)
    # the `device` link names the PCI function (real sysfs) and its uevent agrees
    for d in devs:
        assert sysfs.pci_address(d) == os.path.basename(os.path.realpath(d / "device"))
    assert [(p.dev, p.port) for p in sysfs.all_ports(root)] == [
        ("mlx5_0", 1), ("mlx5_0", 2), ("mlx5_1", 1), ("mlx5_1", 2)]


def test_plain_directory_tree_and_device_info(fixtures):
    (dev,) = sysfs.list_devices(fixtures / "sysfs/mlx5_2port")
    info = sysfs.read_device(dev)
    assert info.dev == "mlx5_0"
    assert info.node_guid == (dev / "node_guid").read_text().strip()
    assert info.fw_ver == (dev / "fw_ver").read_text().strip()
    assert info.pci == "0000:3b:00.0"  # from device/uevent PCI_SLOT_NAME
    assert [p.port for p in info.ports] == [1, 2]


def test_no_infiniband_class_means_no_devices(tmp_path):
    assert sysfs.list_devices(tmp_path) == []
    assert sysfs.all_ports(tmp_path) == []


def test_port_status_roce_and_netdev_from_gid_ndev(fixtures):
    root = fixtures / "sysfs/mlx5_2port"
    for ref in sysfs.all_ports(root):
        st = sysfs.read_port_status(ref)
        assert st.state == "ACTIVE" and st.phys_state == "LinkUp"
        assert st.link_layer == "Ethernet" and st.rate_gbps == 200.0
        assert st.netdev == (ref.path / "gid_attrs/ndevs/0").read_text().strip()


def test_netdev_falls_back_to_dev_port_without_gid_attrs(fixtures, tmp_path):
    root = copy_tree(fixtures, "mlx5_2dev", tmp_path)
    for ref in sysfs.all_ports(root):
        shutil.rmtree(ref.path / "gid_attrs")
    net = sysfs.list_devices(root)[1] / "device/net"
    by_port = {int((net / n / "dev_port").read_text()) + 1: n for n in os.listdir(net)}
    refs = [r for r in sysfs.all_ports(root) if r.dev == "mlx5_1"]
    assert {r.port: sysfs.port_netdev(r) for r in refs} == by_port


def test_infiniband_port_uses_ipoib_netdev_and_reports_down_port(fixtures):
    refs = sysfs.all_ports(fixtures / "sysfs/old_hca")
    status = {r.port: sysfs.read_port_status(r) for r in refs}
    assert status[1].link_layer == "InfiniBand" and status[1].netdev == "ib0"
    assert status[2].state == "DOWN" and status[2].phys_state == "Polling"
    assert status[2].netdev == "ib1"


def test_gids_skip_empty_slots(fixtures):
    ref = sysfs.all_ports(fixtures / "sysfs/mlx5_2port")[0]
    table = [(ref.path / "gids" / str(i)).read_text().strip()
             for i in range(len(os.listdir(ref.path / "gids")))]
    expected = [g for g in table if set(g) != {"0", ":"}]
    assert sysfs.read_gids(ref.path) == expected
    assert 0 < len(expected) < len(table)


def test_counters_read_both_groups_and_skip_settings(fixtures):
    ref = sysfs.all_ports(fixtures / "sysfs/mlx5_2port")[0]
    values, unreadable = sysfs.read_counters(ref.path)
    files = set(os.listdir(ref.path / "counters")) | set(os.listdir(ref.path / "hw_counters"))
    assert set(values) == files - {"lifespan"}
    assert values["port_xmit_data"] == int((ref.path / "counters/port_xmit_data").read_text())
    assert values["np_cnp_sent"] == int((ref.path / "hw_counters/np_cnp_sent").read_text())
    assert unreadable == []


def test_old_hca_has_no_hw_counters(fixtures):
    ref = sysfs.all_ports(fixtures / "sysfs/old_hca")[0]
    values, _ = sysfs.read_counters(ref.path)
    assert set(values) == set(os.listdir(ref.path / "counters"))


def test_unreadable_counters_are_listed_and_others_kept(fixtures, tmp_path):
    root = copy_tree(fixtures, "mlx5_2port", tmp_path)
    p = port_dir(root, "mlx5_0", 1)
    (p / "hw_counters/out_of_sequence").write_text("N/A\n")
    (p / "counters/symbol_error").unlink()
    (p / "counters/symbol_error").symlink_to("nowhere")  # read fails with ENOENT
    (p / "hw_counters/np_cnp_sent").write_text(f"{2**64}\n")  # beyond u64
    values, unreadable = sysfs.read_counters(p)
    assert sorted(unreadable) == ["np_cnp_sent", "out_of_sequence", "symbol_error"]
    assert "rp_cnp_handled" in values and "out_of_sequence" not in values

"""c4/core/topology.py: the leaf-spine model shared by C4D and C4P."""
from __future__ import annotations

import pytest

from c4.core.topology import Topology, TopologyError, pair_id


def test_leaf_spine_places_hosts_in_blocks_and_links_every_leaf_to_every_spine():
    t = Topology.leaf_spine(hosts=8, gpus_per_host=2, leaves=4, spines=3)
    assert [t.host_leaf(h) for h in sorted(t.hosts)] == [
        "leaf00", "leaf00", "leaf01", "leaf01", "leaf02", "leaf02", "leaf03", "leaf03"]
    fabric = [lk for lk in t.links.values() if lk.kind == "fabric"]
    access = [lk for lk in t.links.values() if lk.kind == "access"]
    assert len(fabric) == 4 * 3 and len(access) == 8 * 2
    # non-blocking by default: a leaf's uplinks carry what its hosts can send
    assert sum(lk.gbps for lk in fabric if lk.a == "leaf00") == 2 * 2 * 400.0


def test_routes_stay_in_the_leaf_or_cross_one_spine():
    t = Topology.leaf_spine(hosts=4, gpus_per_host=1, leaves=2, spines=2)
    assert t.route("node000", "mlx5_0", "node001", "mlx5_0", 1) == [
        "node000/mlx5_0-leaf00", "node001/mlx5_0-leaf00"]
    assert t.route("node000", "mlx5_0", "node002", "mlx5_0", 1) == [
        "node000/mlx5_0-leaf00", "leaf00-spine01", "leaf01-spine01", "node002/mlx5_0-leaf01"]
    # the ECMP stand-in is a pure function of the NIC pair and the salt
    r = t.ecmp_route("node000", "mlx5_0", "node003", "mlx5_0", salt=5)
    assert r == t.ecmp_route("node000", "mlx5_0", "node003", "mlx5_0", salt=5)


def test_paths_prefer_the_nic_pair_and_fall_back_to_the_host_pair():
    t = Topology.leaf_spine(hosts=4, gpus_per_host=2, leaves=2, spines=2)
    nic_path = t.route("node000", "mlx5_1", "node003", "mlx5_1", 0)
    host_path = t.route("node000", "mlx5_0", "node003", "mlx5_0", 1)
    t.set_path("node000/mlx5_1", "node003/mlx5_1", nic_path)
    t.set_path("node000", "node003", host_path)
    assert t.path("node000", "node003", "mlx5_1", "mlx5_1") == nic_path
    assert t.path("node000", "node003", "mlx5_0", "mlx5_0") == host_path
    assert t.path("node000", "node003") == host_path
    assert t.path("node003", "node000") is None
    with pytest.raises(TopologyError, match="unknown link"):
        t.set_path("node000", "node001", ["leaf09-spine00"])


def test_json_round_trip(tmp_path):
    t = Topology.leaf_spine(hosts=6, gpus_per_host=2, leaves=3, spines=2)
    t.set_path("node000/mlx5_0", "node005/mlx5_1", t.route("node000", "mlx5_0", "node005",
                                                            "mlx5_1", 1))
    t.save(tmp_path / "t.json")
    u = Topology.load(tmp_path / "t.json")
    assert u.to_dict() == t.to_dict()
    assert u.nic_by_netdev("node004", "eth1").dev == "mlx5_1"


def test_bad_input_is_rejected_with_a_reason(tmp_path):
    with pytest.raises(TopologyError, match="would be empty"):
        Topology.leaf_spine(hosts=2, leaves=3)
    (tmp_path / "bad.json").write_text('{"hosts": [{"gpus": 1}]}')
    with pytest.raises(TopologyError, match="missing or wrong field"):
        Topology.load(tmp_path / "bad.json")
    (tmp_path / "junk.json").write_text("[1, 2")
    with pytest.raises(TopologyError, match="cannot read"):
        Topology.load(tmp_path / "junk.json")


def test_pair_id_is_unordered():
    assert pair_id("b", "a") == pair_id("a", "b") == "a<->b"

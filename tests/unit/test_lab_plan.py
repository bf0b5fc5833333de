"""The lab's pure parts: the fabric plan (addresses, routes, withdrawal), ring orders, fault
parameters, the profiler ABI layout. The netns build itself is tested in tests/root."""
from __future__ import annotations

import ctypes

import pytest

from c4.core.topology import Topology
from c4.lab import profiler
from c4.lab.control import shipped_topologies
from c4.lab.fabric import Fabric, FabricError
from c4.lab.faults import parse_params
from c4.lab.state import LabError, check_prefix
from c4.lab.workload import busbw_mbit, ring_orders


def default() -> Fabric:
    return Fabric(Topology.load(shipped_topologies()["default"]), "t")


def test_every_shipped_topology_plans() -> None:
    for name, path in shipped_topologies().items():
        fab = Fabric(Topology.load(path), "t")
        addrs = [n.addr for n in fab.nics.values()]
        assert len(addrs) == len(set(addrs)), name
        assert all(w.mbit == 100 for w in fab.wires.values() if w.kind == "fabric"), name


def test_leaves_route_other_leaves_over_every_spine_until_a_link_goes_down() -> None:
    fab = default()
    leaf0 = {r.dst: r for r in fab.routes()["t-leaf00"]}
    assert {gw for gw, _ in leaf0["10.0.1.0/24"].hops} == {"172.16.0.1", "172.16.0.3"}
    # leaf01-spine00 down: leaf00 stops sending leaf01's traffic to spine00 (spine00 withdrew
    # it), keeps spine00 for the other leaves, and spine00 no longer routes to leaf01
    routes = fab.routes({"leaf01-spine00"})
    leaf0 = {r.dst: r for r in routes["t-leaf00"]}
    assert [ifn for _, ifn in leaf0["10.0.1.0/24"].hops] == ["s1"]
    assert [ifn for _, ifn in leaf0["10.0.2.0/24"].hops] == ["s0", "s1"]
    assert "10.0.1.0/24" not in {r.dst for r in routes["t-spine00"]}


def test_a_nic_down_takes_only_its_own_routes() -> None:
    fab = default()
    routes = fab.routes({"node003/mlx5_0-leaf01"})
    assert routes["t-node003"] == []
    assert "10.0.1.11/32" not in {r.dst for r in routes["t-leaf01"]}
    assert "10.0.1.10/32" in {r.dst for r in routes["t-leaf01"]}
    hosts = [r for r in fab.routes()["t-node000"] if r.dst == "10.0.0.0/16"]
    assert hosts[0].congctl == "cubic"


def test_bad_names_are_refused() -> None:
    t = Topology.leaf_spine(2, gpus_per_host=1, leaves=1, spines=1, host_prefix="bad host")
    with pytest.raises(FabricError, match="namespace name"):
        Fabric(t, "t")
    with pytest.raises(LabError):
        check_prefix("no-dashes")


def test_rings_cross_the_fabric_and_channels_meet_other_peers() -> None:
    hosts = [(f"node{i:03d}", f"leaf{i // 2:02d}") for i in range(8)]
    rings = ring_orders(hosts, 1, 2)
    leaf = {i: h[1] for i, h in enumerate(hosts)}
    pairs = []
    for ring in rings:
        assert sorted(ring) == list(range(8))
        hops = [(ring[i], ring[(i + 1) % 8]) for i in range(8)]
        assert all(leaf[a] != leaf[b] for a, b in hops)
        pairs.append({frozenset(h) for h in hops})
    assert not pairs[0] & pairs[1]


def test_bus_bandwidth_as_nccl_tests_define_it() -> None:
    # 8 ranks, 1 MB in 1 s: algbw 8 Mbit/s, bus bw x 2*7/8
    assert busbw_mbit(1_000_000, 1.0, 8) == pytest.approx(14.0)


def test_fault_parameters_are_checked() -> None:
    assert parse_params("loss", ["percent=2.5", "direction=ab"]) == {"percent": 2.5,
                                                                     "direction": "ab"}
    for bad in (["percent=0"], ["direction=up"], ["rate=3"], ["percent=x"]):
        with pytest.raises(LabError):
            parse_params("loss", bad)


def test_profiler_descriptor_matches_nccl_v5_layout() -> None:
    # NCCL profiler_v5.h: u64 type, void* parentObj, int rank, then the union whose largest
    # member (coll, 88 bytes on LP64) sets its size
    assert ctypes.sizeof(profiler._Coll) == 88
    assert profiler.Descr.u.offset == 24
    assert ctypes.sizeof(profiler.Descr) == 112
    assert profiler._ProxyOp.isSend.offset == 20

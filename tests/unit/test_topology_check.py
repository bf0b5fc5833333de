"""Topology for planning: ports, planes, pods, addresses; `c4 topology check` with lines."""
from __future__ import annotations

import json

import pytest

from c4.cli import main
from c4.core import jsonpos
from c4.core.topology import Topology, TopologyError, check_text

GOOD = """{
 "hosts": [
  {"name": "a", "gpus": 2, "nics": [
    {"dev": "mlx5_0", "rail": 0, "bond": true, "ports": [
      {"port": 1, "leaf": "p0.leaf0", "gbps": 200, "addr": "10.0.0.1"},
      {"port": 2, "leaf": "p1.leaf0", "gbps": 200, "addr": "10.1.0.1"}]}]},
  {"name": "b", "gpus": 2, "nics": [
    {"dev": "mlx5_0", "rail": 0, "bond": true, "ports": [
      {"port": 1, "leaf": "p0.leaf1", "gbps": 200, "addr": "10.0.1.1"},
      {"port": 2, "leaf": "p1.leaf1", "gbps": 200, "addr": "10.1.1.1"}]}]}
 ],
 "switches": [
  {"name": "p0.leaf0", "tier": "leaf", "plane": 0}, {"name": "p0.leaf1", "tier": "leaf", "plane": 0},
  {"name": "p0.spine0", "tier": "spine", "plane": 0, "addrs": ["10.255.0.1"]},
  {"name": "p1.leaf0", "tier": "leaf", "plane": 1}, {"name": "p1.leaf1", "tier": "leaf", "plane": 1},
  {"name": "p1.spine0", "tier": "spine", "plane": 1, "addrs": ["10.255.1.1"]}
 ],
 "links": [
  {"id": "p0.leaf0-p0.spine0", "a": "p0.leaf0", "b": "p0.spine0", "gbps": 200,
   "addrs": {"p0.leaf0": "10.2.0.0", "p0.spine0": "10.2.0.1"}},
  {"id": "p0.leaf1-p0.spine0", "a": "p0.leaf1", "b": "p0.spine0", "gbps": 200,
   "addrs": {"p0.leaf1": "10.2.1.0", "p0.spine0": "10.2.1.1"}},
  {"id": "p1.leaf0-p1.spine0", "a": "p1.leaf0", "b": "p1.spine0", "gbps": 200},
  {"id": "p1.leaf1-p1.spine0", "a": "p1.leaf1", "b": "p1.spine0", "gbps": 200}
 ]
}
"""


def test_dual_plane_bonded_nic_reaches_the_peer_through_either_plane():
    t = Topology.from_dict(json.loads(GOOD))
    paths = t.candidate_paths("a/mlx5_0", "b/mlx5_0")
    assert paths == [
        ("a/mlx5_0-p0.leaf0", "p0.leaf0-p0.spine0", "p0.leaf1-p0.spine0", "b/mlx5_0-p0.leaf1"),
        ("a/mlx5_0:2-p1.leaf0", "p1.leaf0-p1.spine0", "p1.leaf1-p1.spine0",
         "b/mlx5_0:2-p1.leaf1")]
    # a specific port of the NIC stays in its plane
    assert [p[1] for p in t.candidate_paths("a/mlx5_0:2", "b/mlx5_0")] == ["p1.leaf0-p1.spine0"]


def test_probe_hops_map_to_links_by_interface_or_by_switch_address():
    t = Topology.from_dict(json.loads(GOOD))
    # routers answer from their inbound interface: the spine's on leaf0's link, then leaf1's
    # on the spine's link (the first leaf stayed silent)
    p0 = t.links_from_hops("a/mlx5_0", "b/mlx5_0", [None, "10.2.0.1", "10.2.1.0"])
    assert p0 is not None and p0[1] == "p0.leaf0-p0.spine0"
    # loopback answers name switches; consecutive switches pin the links
    p1 = t.links_from_hops("a/mlx5_0", "b/mlx5_0", [None, "10.255.1.1", None])
    assert p1 is not None and p1[1] == "p1.leaf0-p1.spine0"
    # no answers at all: both planes fit, so nothing is learned
    assert t.links_from_hops("a/mlx5_0", "b/mlx5_0", [None, None, None]) is None
    assert t.links_from_hops("a/mlx5_0", "b/mlx5_0", ["192.0.2.9", None, None]) is None
    assert t.nic_by_addr("10.1.1.1")[1].name == "mlx5_0:2"


def test_round_trip_keeps_ports_planes_pods_and_addresses():
    t = Topology.from_dict(json.loads(GOOD))
    assert Topology.from_dict(json.loads(json.dumps(t.to_dict()))).to_dict() == t.to_dict()
    c = Topology.clos(32, 8, hosts_per_leaf=4, spines=2, pods=2, cores_per_spine=2)
    u = Topology.from_dict(json.loads(json.dumps(c.to_dict())))
    assert u.to_dict() == c.to_dict()
    assert len(u.candidate_paths("node000/mlx5_3", "node031/mlx5_3")) == 2 * 2  # spine x core


def test_clos_factories_are_non_blocking_and_check_clean():
    for t in (Topology.clos(64, 8, hosts_per_leaf=8, spines=4),
              Topology.clos(64, 8, hosts_per_leaf=8, spines=4, planes=2, dual_port=True),
              Topology.clos(64, 8, hosts_per_leaf=8, spines=2, pods=2, cores_per_spine=2)):
        _, problems = check_text(json.dumps(t.to_dict(), indent=1))
        assert problems == []
        for leaf in t.leaves:
            down = sum(lk.gbps for lk in t.links.values() if lk.b == leaf and lk.kind == "access")
            up = sum(lk.gbps for lk in t.links.values() if lk.a == leaf and lk.kind == "fabric")
            assert up == pytest.approx(down)


BAD = """{
 "hosts": [
  {"name": "a", "nics": [{"dev": "mlx5_0", "leaf": "leaf9"}]},
  {"name": "b", "nics": [{"dev": "mlx5_0", "leaf": "spine0"},
                         {"dev": "mlx5_0", "leaf": "leaf0"}]},
  {"name": "a", "nics": []},
  {"name": "c", "colour": "red", "nics": [{"dev": "mlx5_0", "leaf": "leaf0", "gbps": -1}]}
 ],
 "leaves": ["leaf0", "leaf1"],
 "spines": ["spine0"],
 "switches": [{"name": "leaf1", "plane": 1}, {"name": "spine0", "plane": 0}],
 "links": [
  {"id": "leaf0-spine0", "a": "leaf0", "b": "spine0", "gbps": 100},
  {"id": "leaf1-spine0", "a": "leaf1", "b": "spine0", "gbps": 100},
  {"id": "leaf0-spine9", "a": "leaf0", "b": "spine9", "gbps": 100},
  {"id": "leaf0-spine0", "a": "leaf0", "b": "spine0", "gbps": 100}
 ],
 "paths": [{"src": "a", "dst": "b", "links": ["leaf0-spine0", "leaf1-spine0", "nope"]}]
}
"""


def test_check_reports_each_problem_at_its_line():
    _, problems = check_text(BAD)
    got = {(p.line, p.level, p.msg) for p in problems}
    expect = [
        (3, "error", "a/mlx5_0: attaches to unknown switch leaf9"),
        (4, "error", "b/mlx5_0: attaches to spine0, a spine, not a leaf"),
        (4, "error", "host b: NIC mlx5_0 defined twice"),
        (6, "error", "host a defined twice"),
        (7, "warning", "host c: unknown field 'colour' (ignored)"),
        (7, "error", "c/mlx5_0: gbps must be > 0, got -1"),
        (14, "error", "link leaf1-spine0: joins plane 1 (leaf1) to plane 0 (spine0)"),
        (15, "error", "link leaf0-spine9: unknown switch spine9"),
        (16, "error", "link leaf0-spine0 defined twice"),
        (18, "error", "path a -> b: unknown link(s) nope"),
    ]
    for line, level, msg in expect:
        assert (line, level, msg) in got, (line, msg, sorted(got))
    with pytest.raises(TopologyError, match="unknown switch leaf9"):
        Topology.from_dict(json.loads(BAD))


def test_check_reports_syntax_errors_and_fabric_warnings():
    _, problems = check_text('{\n "hosts": [\n  {"name": "a",}\n ]\n}\n')
    assert [(p.line, p.level) for p in problems] == [(3, "error")]
    t = Topology.leaf_spine(4, 2, leaves=2, spines=2, fabric_gbps=400)
    _, problems = check_text(json.dumps(t.to_dict(), indent=1))
    assert {p.msg for p in problems} == {
        f"leaf {lf} is oversubscribed 2.00:1 (1600 Gb/s down, 800 Gb/s up)"
        for lf in ("leaf00", "leaf01")}
    assert all(p.level == "warning" for p in problems)


def test_jsonpos_lines_and_plain_values():
    d = jsonpos.loads('{"a": 1,\n "b": [\n  {"c": "x"}\n ]}')
    assert d == {"a": 1, "b": [{"c": "x"}]}
    assert d.line == 1 and d.line_of("b") == 2 and d["b"][0].line == 3
    with pytest.raises(json.JSONDecodeError):
        jsonpos.loads('{"a": 1} x')


def test_cli_check_exit_status_and_json(tmp_path, capsys):
    good, bad = tmp_path / "good.json", tmp_path / "bad.json"
    good.write_text(GOOD)
    bad.write_text(BAD)
    assert main(["topology", "check", str(good)]) == 0
    assert "2 hosts, 4 NIC ports" in capsys.readouterr().out
    assert main(["topology", "check", str(bad), "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False
    assert {"level": "error", "line": 15,
            "msg": "link leaf0-spine9: unknown switch spine9"} in out["problems"]
    assert main(["topology", "check", str(tmp_path / "missing.json")]) == 2

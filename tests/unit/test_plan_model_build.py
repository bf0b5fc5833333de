"""C4P model input: the vectorised arcs and the path map's grouping that a first build reads
instead of going over every port (docs/planning.md, "Kept between plans")."""
from __future__ import annotations

import random

import pytest

from c4.aggregator.planner.model import Arcs
from c4.aggregator.planner.pathmap import PathMap
from c4.core.topology import Topology


@pytest.mark.parametrize("topo", [
    Topology.clos(8, 2, hosts_per_leaf=2, spines=2, pods=2, cores_per_spine=2),
    Topology.clos(8, 2, hosts_per_leaf=2, spines=3, planes=2, dual_port=True),
])
def test_arcs_of_many_paths_at_once_are_those_of_each_path(topo):
    arcs = Arcs(topo)
    eps = [f"{h}/{n.dev}" for h in sorted(topo.hosts) for n in topo.hosts[h].nics]
    paths = [p for s in eps for d in eps if s != d for p in topo.candidate_paths(s, d)]
    assert len({len(p) for p in paths}) > 1  # paths of several lengths in one pass
    assert arcs.of_paths(paths) == [arcs.of_path(p) for p in paths]
    assert arcs.of_paths([]) == []
    bad = paths[0][:1] + paths[0][2:]  # a link skipped: the path does not chain
    with pytest.raises(ValueError, match="does not continue it"):
        arcs.of_paths(paths[:3] + [bad])


def test_pathmap_groups_ports_by_path_in_order_whatever_the_learning_order():
    rng = random.Random(3)
    paths = [("l0", f"u{i}", "d") for i in range(5)]
    learned = [(port, rng.choice(paths)) for port in rng.sample(range(50000, 50100), 40)]
    pm = PathMap(ttl_s=10)
    for t, (port, path) in enumerate(learned):
        pm.learn("a/x", "b/x", "roce", port, path, t / 10)
    pm.learn("a/x", "b/x", "roce", learned[0][0], paths[4], 5.0)  # a port that moved
    want: dict[tuple[str, ...], list[int]] = {}
    for port, path in sorted(pm.ports("a/x", "b/x", "roce", 5.0).items()):
        want.setdefault(path, []).append(port)
    got, until = pm.by_path(("a/x", "b/x", "roce"), 5.0)
    assert list(got) == sorted(want) and {p: list(v) for p, v in got.items()} == want
    assert until == pytest.approx(0.1 + 10)  # the oldest entry left: learned[0] was re-learned
    # what forget_link and expiry leave is grouped the same way; stale ports are not in it
    pm.forget_link("u2")
    got, _ = pm.by_path(("a/x", "b/x", "roce"), 12.0)
    fresh = {p: path for p, path in pm.ports("a/x", "b/x", "roce", 12.0).items()}
    assert sorted(p for v in got.values() for p in v) == sorted(fresh)
    assert all(fresh[p] == path for path, v in got.items() for p in v)
    assert list(got) == sorted(got) and "u2" not in {lk for p in got for lk in p}
    pm.expire(12.0)
    assert pm.by_path(("a/x", "b/x", "roce"), 12.0)[0] == got
    assert pm.by_path(("a/x", "b/x", "tcp:1"), 12.0) == ({}, float("inf"))

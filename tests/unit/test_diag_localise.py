"""localise.py: naming the component behind bad connections, on a real topology's paths."""
from __future__ import annotations

from c4.core.topology import Topology, endpoint, pair_id
from c4.aggregator.diagnosis import localise
from c4.aggregator.diagnosis.localise import (PRIO_ACCESS, PRIO_FABRIC, PRIO_HOST, PRIO_NIC,
                                           PRIO_PAIR)


def ring_cells(topo: Topology, salt: int = 0) -> dict:
    """Connections of a rail ring over all hosts (NIC i of each host to NIC i of the next),
    with the components each passes through, as the diagnosis model builds them."""
    hosts = sorted(topo.hosts)
    cells = {}
    for i, h in enumerate(hosts):
        nxt = hosts[(i + 1) % len(hosts)]
        for nic in topo.hosts[h].nics:
            comps = [("host", h, h, PRIO_HOST), ("host", nxt, nxt, PRIO_HOST),
                     ("nic", endpoint(h, nic.dev), h, PRIO_NIC),
                     ("nic", endpoint(nxt, nic.dev), nxt, PRIO_NIC),
                     ("link", pair_id(h, nxt), None, PRIO_PAIR)]
            for lk in topo.ecmp_route(h, nic.dev, nxt, nic.dev, salt):
                prio = PRIO_FABRIC if topo.links[lk].kind == "fabric" else PRIO_ACCESS
                comps.append(("link", lk, None, prio))
            cells[(h, nxt, nic.dev)] = comps
    return cells


TOPO = Topology.leaf_spine(hosts=16, gpus_per_host=4, leaves=8, spines=4)
CELLS = ring_cells(TOPO)


def through(component: str) -> set:
    return {k for k, comps in CELLS.items() if any(c[1] == component for c in comps)}


def test_a_whole_row_and_column_names_the_host():
    bad = through("node005")
    top = localise.rank(bad, CELLS)[0]
    assert (top.kind, top.id) == ("host", "node005")
    assert top.posterior > 0.99 and top.n_bad == len(bad) == 8


def test_the_cells_of_one_nic_name_the_nic_not_its_host():
    bad = through("node005/mlx5_2")
    top = localise.rank(bad, CELLS)[0]
    assert (top.kind, top.id) == ("nic", "node005/mlx5_2")
    assert "link:node005/mlx5_2-leaf02" in top.aliases  # the NIC and its cable look alike


def test_cells_sharing_a_fabric_link_elect_it():
    loads = {lk: len(through(lk)) for lk, v in TOPO.links.items() if v.kind == "fabric"}
    busy = max(sorted(loads), key=lambda lk: loads[lk])
    assert loads[busy] >= 3
    top = localise.rank(through(busy), CELLS)[0]
    assert (top.kind, top.id) == ("link", busy) and top.posterior > 0.9


def test_a_host_pair_whose_paths_share_no_link_names_the_pair_path():
    bad = {k for k in CELLS if k[:2] == ("node005", "node006")}
    top = localise.rank(bad, CELLS)[0]
    assert (top.kind, top.id) == ("link", "node005<->node006")


def test_a_lone_cell_is_ambiguous():
    ranked = localise.rank({("node005", "node006", "mlx5_1")}, CELLS)
    assert ranked[0].posterior < 0.8  # NIC, cable, fabric link or path: cannot tell


def test_two_faults_are_peeled_apart():
    bad = through("node003") | through("node011/mlx5_0")
    found, rest = localise.peel(bad, CELLS, 0.8)
    assert [(r[0].kind, r[0].id) for r in found] == [("host", "node003"),
                                                     ("nic", "node011/mlx5_0")]
    assert rest == []


def test_healthy_cells_exonerate_and_noise_is_not_a_fault():
    assert localise.rank(set(), CELLS) == []
    # a component whose other cells are fine loses to the one all bad cells share
    bad = through("node005") - {next(iter(through("node005/mlx5_0")))}
    top = localise.rank(bad, CELLS)[0]
    assert top.id == "node005" and top.n_all - top.n_bad == 1


def test_unrelated_aliases_split_the_belief_and_never_name_a_node():
    # two connections that share a NIC and a fabric link and nothing else: which is it?
    cells = {
        (1, 2): [("host", "a", "a", PRIO_HOST), ("host", "b", "b", PRIO_HOST),
                 ("nic", "a/mlx5_0", "a", PRIO_NIC), ("nic", "b/mlx5_0", "b", PRIO_NIC),
                 ("link", "leaf0-spine0", None, PRIO_FABRIC)],
        (3, 1): [("host", "c", "c", PRIO_HOST), ("host", "a", "a", PRIO_HOST),
                 ("nic", "c/mlx5_0", "c", PRIO_NIC), ("nic", "a/mlx5_0", "a", PRIO_NIC),
                 ("link", "leaf0-spine0", None, PRIO_FABRIC)],
        (4, 5): [("host", "a", "a", PRIO_HOST), ("nic", "a/mlx5_1", "a", PRIO_NIC)],
        (2, 6): [("nic", "b/mlx5_0", "b", PRIO_NIC)],
        (6, 3): [("nic", "c/mlx5_0", "c", PRIO_NIC)],
    }
    top = localise.rank({(1, 2), (3, 1)}, cells)[0]
    assert (top.kind, top.id) == ("link", "leaf0-spine0")
    assert "nic:a/mlx5_0" in top.aliases and top.split == 2
    assert top.posterior < 0.5


def test_one_extra_slow_connection_is_not_a_second_fault():
    bad = through("node005")
    values = {k: 3.0 for k in bad}
    one = next(iter(sorted(bad)))
    values[one] = 9.0  # a blip on top of the slow node
    found, rest = localise.peel(bad, CELLS, 0.8, values)
    assert [(r[0].kind, r[0].id) for r in found] == [("host", "node005")] and rest == []

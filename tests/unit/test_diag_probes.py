"""C4D asks C4P for probes where a path could separate a fault's candidate links, and uses
the paths they learn (aggregator/diagnosis/probes.py, model.learned_path). The prober here
is C4P's path map (the real PathMap class) answering each request at once with the route the
simulated fabric takes; the planner's side is tested in test_planner_service.py."""
from __future__ import annotations

from c4.aggregator.planner.pathmap import PathMap
from c4.aggregator.replay import Replay
from c4.core.topology import Topology, endpoint
from c4.lab.evaluate import load_truth, score
from c4.lab.sim import EPOCH, Fault, SimConfig, Simulator

# Two jobs on every host: a ring on GPUs 0-1, a tree on GPUs 2-3. Down leaf00-spine00 (towards
# leaf00), the ring's only connections are node003 -> node000 via spine00, which cross
# leaf03-spine00 up as well: alone, the ring cannot tell the two apart. The tree crosses
# each of them with other host pairs.
CFG = dict(hosts=4, gpus_per_host=4, leaves=4, spines=2, jobs=2, share_hosts=True,
           collective="ring,tree", duration=50, seed=1, realism=False, max_skew=0)
FAULT = "slow-fabric:leaf00-spine00@10;x=2.5;dir=down"


class Probes:
    def __init__(self, routes: dict[tuple[str, str], tuple[str, ...]]) -> None:
        self.routes = routes
        self.map = PathMap()
        self.asked: list[tuple[str, str]] = []

    def learned_path(self, src: str, dst: str, now: float) -> tuple[str, ...] | None:
        paths = set(self.map.ports(src, dst, "roce", now).values())
        return paths.pop() if len(paths) == 1 else None

    def request_probe(self, src: str, dst: str, now: float) -> bool:
        self.asked.append((src, dst))
        self.map.learn(src, dst, "roce", 0xC000, self.routes[(src, dst)], now)
        return True


def run(tmp_path, probes: Probes | None, topo: Topology):
    out = tmp_path / "run.c4rec"
    r = Replay(topology=topo)
    if probes is not None:
        r.core.diagnosis.use_paths(probes)
    r.feed(out)
    incidents = r.finish().incidents
    return incidents, score(load_truth(out), incidents, EPOCH)


def setup(tmp_path):
    sim = Simulator(SimConfig(faults=[Fault.parse(FAULT)], **CFG))
    out = tmp_path / "run.c4rec"
    sim.run(out)
    topo = Topology.load(f"{out}.topology.json")
    # the tree's paths were never probed: the topology does not know them
    routes = {(endpoint(c.src_host, c.src_dev), endpoint(c.dst_host, c.dst_dev)): c.links
              for c in sim.jobs[1].conns}
    for pair in routes:
        del topo.paths[pair]
    return topo, routes


def test_other_jobs_connections_separate_a_ring_paths_links(tmp_path):
    sim = Simulator(SimConfig(faults=[Fault.parse(FAULT)], **CFG))
    sim.run(tmp_path / "run.c4rec")
    incidents, sc = run(tmp_path, None, Topology.load(tmp_path / "run.c4rec.topology.json"))
    assert sc.named == 1 and sc.false_incidents == 0, (sc.misses, sc.wrong)
    (inc,) = incidents
    assert inc["evidence"]["direction"] == "towards leaf00"


def test_without_their_paths_the_fault_is_named_as_a_path(tmp_path):
    topo, _ = setup(tmp_path)
    incidents, sc = run(tmp_path, None, topo)
    assert sc.named == 0 and sc.false_isolations == 0
    assert all(i["localised"] is None for i in incidents)
    assert "path" in {i["suspects"][0]["kind"] for i in incidents}


def test_a_probe_of_the_connections_that_could_separate_them_names_the_link(tmp_path):
    topo, routes = setup(tmp_path)
    probes = Probes(routes)
    incidents, sc = run(tmp_path, probes, topo)
    assert sc.named == 1 and sc.false_incidents == 0, (sc.misses, sc.wrong)
    # only connections whose equal-cost paths cross one candidate link and not the other
    cands = {"leaf00-spine00", "leaf03-spine00"}
    for pair in probes.asked:
        paths = [set(p) for p in topo.candidate_paths(*pair)]
        assert any(cands & p and not cands <= p for p in paths), pair
    assert len(probes.asked) == len(set(probes.asked)) < len(routes)

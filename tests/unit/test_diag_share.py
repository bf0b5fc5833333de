"""C4D's slow detector judges a connection against its load share (issue 13, the C4P/C4D loop
of the live lab, docs/benchmarks.md run A): when C4P moves connections onto a sibling link,
that link carries more of them and each gets a smaller share of it. Congestion from a fair
share is no broken link; a link slower than its share predicts still is.

The job is the lab's ring on the lab's fabric (tests/fixtures/lab/topology.json: 8 hosts, 4
leaves, 2 spines, 100 Mbit/s fabric links): every rank sends to the ranks two ahead and two
behind, each connection on its own TCP socket, whose port C4P's path map knows (as probes
teach it). Each connection moves data at the fair share of the busiest link of its path
(capacity / the connections crossing it in its direction). The recording is replayed through
ingest and the real diagnosis."""
from __future__ import annotations

import math
import random
from collections import Counter
from pathlib import Path
from typing import Any, Callable

from c4.aggregator.config import AggregatorConfig
from c4.aggregator.replay import Replay
from c4.core import record, wire
from c4.core.topology import Topology
from tests.unit.test_diag_outage import run as replay_lab
from tests.unit.test_diag_outage import unpack as unpack_lab

TOPO = Topology.load(Path(__file__).resolve().parents[1] / "fixtures" / "lab" / "topology.json")
HOSTS = sorted(TOPO.hosts)
BUSY_S = 0.8  # of each 1 s interval a connection spends moving data (the rest: credit waits)
NOISE = 0.08  # lognormal sigma of a report's time per byte
AVOIDED = "leaf00-spine00"  # the link C4P plans around
CROWDED = "leaf00-spine01"  # ... and the sibling the moved connections now share

Conn = tuple[int, int]  # (rank, peer rank)


def nic(r: int) -> str:
    return f"{HOSTS[r]}/{TOPO.hosts[HOSTS[r]].nics[0].dev}"


def addr(r: int) -> str:
    a = TOPO.hosts[HOSTS[r]].nics[0].addr
    assert a is not None
    return a


def leaf(r: int) -> str:
    return TOPO.hosts[HOSTS[r]].nics[0].leaf


def links(c: Conn, spine: str) -> tuple[str, ...]:
    (s, d) = c
    if leaf(s) == leaf(d):
        return (f"{nic(s)}-{leaf(s)}", f"{nic(d)}-{leaf(d)}")
    return (f"{nic(s)}-{leaf(s)}", f"{leaf(s)}-{spine}", f"{leaf(d)}-{spine}",
            f"{nic(d)}-{leaf(d)}")


CONNS: list[Conn] = [(r, (r + k) % 8) for r in range(8) for k in (2, -2)]
# the balanced plan: two connections on each direction of every fabric link
BALANCED = {(s, d): f"spine0{(s + (d == (s + 2) % 8)) % 2}" for s, d in CONNS}
# C4P planned leaf00's traffic around AVOIDED: the two connections leaving leaf00 on it now
# take CROWDED, four connections up it
REPLANNED = {c: "spine01" if AVOIDED in links(c, sp) and leaf(c[0]) == "leaf00" else sp
             for c, sp in BALANCED.items()}


def rates(plan: dict[Conn, str], gbps: dict[str, float]) -> dict[Conn, float]:
    """Bytes/s of each connection: its fair share of the busiest link of its path, each
    direction of a cable its own capacity."""
    hops = {c: TOPO.orient(nic(c[0]), list(links(c, sp))) for c, sp in plan.items()}
    load = Counter(h for hs in hops.values() for h in hs)
    cap = {lk.id: gbps.get(lk.id, lk.gbps) for lk in TOPO.links.values()}
    return {c: min(cap[h[0]] / load[h] for h in hs) * 1e9 / 8 for c, hs in hops.items()}


def flow(c: Conn, gen: int, nbytes: int, closed: bool = False) -> dict[str, Any]:
    return {"saddr": addr(c[0]), "daddr": addr(c[1]), "sport": port(c, gen), "dport": 30000,
            "family": "ipv4", "netns": 1, "pid": 1000 + c[0], "comm": "python",
            "state": "CLOSE" if closed else "ESTABLISHED", "bytes_acked": nbytes,
            "bytes_received": 0, "retrans_segs": 0, "bytes_acked_delta": nbytes,
            "bytes_received_delta": 0, "retrans_segs_delta": 0, "bytes_acked_rate": nbytes,
            "bytes_received_rate": 0, "srtt_us": 500, "cwnd": 10, "closed": closed}


def port(c: Conn, gen: int) -> int:
    """The source port of connection c after `gen` re-plans (the ring reconnects on it)."""
    return 40000 + 100 * gen + 10 * c[0] + (c[1] - c[0]) % 8


def run(tmp: Path, phases: list[tuple[float, dict[Conn, str], dict[str, float]]],
        duration: float = 70.0, seed: int = 1,
        slower: Callable[[int, Conn], float] = lambda t, c: 1.0) -> list[dict[str, Any]]:
    """Record the ring for `duration` s through `phases` (start s, plan, link -> Gbit/s
    overrides; the first plan's connections are the job's), replay it with the lab
    aggregator's thresholds; the incidents. `slower`: how
    many times longer connection c takes per byte at second t than its link share gives (an
    end host's own slowness)."""
    rng = random.Random(seed)
    rec = tmp / "ring.c4rec"
    t0 = 1.8e9
    conns = list(phases[0][1])
    gen = {c: 0 for c in conns}
    paths = []
    with record.Writer(rec) as w:
        seq = Counter[str]()

        def send(host: str, kind: str, ts: float, body: dict[str, Any]) -> None:
            seq[host] += 1
            w.write(wire.encode(wire.Frame(kind, host, "b00t", seq[host], ts, body)))

        for h in HOSTS:
            th = TOPO.hosts[h]
            send(h, "hello", t0, {
                "agent_version": "test", "interval": 1.0, "collectors": {"nccl": {"ok": True}},
                "nics": [{"dev": n.dev, "ports": [{"port": 1, "state": "ACTIVE",
                                                   "netdev": n.netdev, "rail": n.rail}]}
                         for n in th.nics],
                "netdevs": [{"name": n.netdev, "addrs": [f"{n.addr}/16"]} for n in th.nics]})
        plan: dict[Conn, str] = {}
        for t in range(1, int(duration)):
            now_plan, gbps = [(p, g) for start, p, g in phases if start <= t][-1]
            moved = {c for c in conns if plan and plan[c] != now_plan[c]}
            for c in conns:
                if not plan or c in moved:
                    gen[c] += bool(plan)
                    paths.append({"src": nic(c[0]), "dst": nic(c[1]), "proto": "tcp",
                                  "dport": 30000, "sport": port(c, gen[c]),
                                  "links": list(links(c, now_plan[c]))})
            plan = now_plan
            rate = rates(plan, gbps)
            for r in range(8):
                sends = [(c, int(rate[c] * BUSY_S / slower(t, c))) for c in conns if c[0] == r]
                peers = [{"peer": c[1], "channel": i, "dir": "send", "bytes": b, "steps": 8,
                          "net_wait_s": round(BUSY_S * math.exp(rng.gauss(0, NOISE)), 6)}
                         for i, (c, b) in enumerate(sends)]
                flows = [flow(c, gen[c], b) for c, b in sends]
                flows += [flow(c, gen[c] - 1, 0, closed=True) for c, _ in sends if c in moved]
                send(HOSTS[r], "report", t0 + t + 0.01 * r, {
                    "interval": 1.0, "health": {"nccl": {"ok": True}},
                    "nccl": {"comms": [{
                        "comm": "00000000000000c4", "rank": r, "nranks": 8, "seq_started": t + 1,
                        "seq_completed": t, "pid": 1000 + r, "job": "ring", "dev": 0,
                        "colls": [{"func": "AllReduce", "count": 1, "bytes": 1 << 22,
                                   "time_s": 0.95}],
                        "peers": peers}]},
                    "tcp_flows": {"flows": flows, "omitted": 0, "tracked": len(flows),
                                  "map_full": 0, "drops": {}, "drops_delta": {},
                                  "owners": [{"pid": 1000 + r, "state": "S", "job": "ring"}]}})
    # C4P's path map knows every port the plans use, as its probes teach it
    replay = Replay(cfg=AggregatorConfig(diagnosis={"min_cell_bytes": 131072,
                                                    "tcp_min_bytes": 131072}),
                    topology=TOPO)
    replay.feed(rec, paths=paths)
    return replay.finish().incidents


def named(incidents: list[dict[str, Any]]) -> list[str]:
    return [i["suspects"][0]["id"] for i in incidents if i["localised"]]


def test_the_plans_are_what_they_say() -> None:
    """The premise: balanced, every direction of a fabric link carries two connections; after
    the re-plan CROWDED carries four up from leaf00, each at half the rate, as much in total."""
    before, after = rates(BALANCED, {}), rates(REPLANNED, {})
    assert set(before.values()) == {0.1e9 / 8 / 2}
    up = [c for c in CONNS if CROWDED in links(c, REPLANNED[c]) and leaf(c[0]) == "leaf00"]
    assert len(up) == 4 and sum(REPLANNED[c] != BALANCED[c] for c in up) == 2
    assert all(after[c] == before[c] / 2 for c in up)
    assert sum(after[c] for c in up) == 0.1e9 / 8


def test_connections_moved_onto_a_shared_link_are_no_slow_link(tmp_path: Path) -> None:
    """C4P re-plans at 20 s; the moved connections and those already up CROWDED each get
    half of it from then on (2x the network time per byte; 1.5x on the down links they now
    share with two others), the link moving what a healthy link moves. Judged against the
    job's baseline alone, C4D named leaf02-spine01 (the marginal rule, 1.5x: leaf02's
    connections up it now share spine01's down links with the moved ones) in 10 of 10 seeds,
    and CROWDED (2x per report) in 8, as the lab's run A did."""
    incidents = run(tmp_path, [(0, BALANCED, {}), (20, REPLANNED, {})])
    assert incidents == [], [i["summary"] for i in incidents]


def test_a_slow_link_with_its_load_share_unchanged_is_named(tmp_path: Path) -> None:
    """leaf01-spine01 capped to 10 Mbit/s at 20 s, its two connections each way unchanged."""
    incidents = run(tmp_path, [(0, BALANCED, {}), (20, BALANCED, {"leaf01-spine01": 0.01})])
    assert named(incidents) == ["leaf01-spine01"], [i["summary"] for i in incidents]


def test_a_shared_link_slower_than_its_share_predicts_is_named(tmp_path: Path) -> None:
    """After the re-plan, CROWDED (now four connections up) degrades to 40 Mbit/s: those take
    5x the balanced time per byte where their share predicts 2x."""
    incidents = run(tmp_path, [(0, BALANCED, {}), (15, REPLANNED, {}),
                               (35, REPLANNED, {CROWDED: 0.04})])
    assert named(incidents) == [CROWDED], [i["summary"] for i in incidents]
    [inc] = incidents
    assert 2.0 <= inc["evidence"]["ratio"] <= 3.0  # against the share: 5x / 2x
    assert inc["evidence"]["expected_s_per_gb"] > inc["evidence"]["baseline_s_per_gb"]


def test_connections_moved_off_a_slow_link_do_not_carry_its_history(tmp_path: Path) -> None:
    """AVOIDED capped to 10 Mbit/s at 10 s and named; C4P then moves leaf00's connections off
    it onto CROWDED (healthy, now shared by twice as many). Their slow reports on AVOIDED are
    no evidence about CROWDED: it was named within a report of the move."""
    incidents = run(tmp_path, [(0, BALANCED, {}), (10, BALANCED, {AVOIDED: 0.01}),
                               (30, REPLANNED, {AVOIDED: 0.01})])
    assert named(incidents) == [AVOIDED], [i["summary"] for i in incidents]


def test_a_plan_that_crowds_a_link_is_no_marginal_slowness(tmp_path: Path) -> None:
    """17-flap-leaf02-spine00-replan (lab run K, 2026-12-01): the flap named, C4P re-planned
    the ring off leaf02-spine00 and a third connection joined leaf01-spine01 and
    leaf02-spine01 each way. Their unmoved connections then ran 1.5-2x what their new load
    share predicts (those crossing both crowded links slowest: the share model takes the
    busiest link of a path, TCP pays for each), and the marginal rule, comparing them with
    their reports from before the plan, named leaf01-spine01 at 0.83, as in a CI run where it
    opened on the clean ring after C4P's first plan. A connection whose load share changed
    restarts its marginal history (slow.py): only the flap's incident."""
    rec, truth = unpack_lab("17-flap-leaf02-spine00-replan", tmp_path)
    incidents = replay_lab(rec, truth)
    assert [i["suspects"][0]["id"] for i in incidents] == ["leaf02-spine00"], \
        [i["summary"] for i in incidents]

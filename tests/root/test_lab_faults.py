"""Issue 11: every fault kind the lab injects into the ring job is named by C4D on the real
fabric, alone (no other incident open), within the diagnosis targets (hang <= 10 s, a slow or
lossy link <= 30 s). Each test builds its own lab (fixture) and tears it down.

The agents also run eBPF tcp_flows (as `c4 lab up` does by default): a flapping link is named from the
flows that retransmit in its down phases. Timings are not asserted beyond the targets;
bench/lab measures them."""
from __future__ import annotations

import time
from typing import Iterator

import pytest

from c4.lab import control, faults, netns, runs
from c4.lab.state import LabState
from c4.lab.workload import read_steps

from ._lab import describe, down_pairs, into_leaf_bytes, lab_for, others_open, wait_named

pytestmark = pytest.mark.root
LINK_S = 30.0
HANG_S = 10.0
# No issue sets a straggler target. A rank starved to 2% CPU: on the ring every rank waits for
# it, and only its collectives are short (straggler.py's collective view). Replaying the six
# recordings of `bench/lab --kinds straggler` (2026-12-01): named in 8-11 s; before that view,
# by the marginal slow rule over 20 reports, 19-52 s (46.5 s in one CI run).
STRAGGLER_S = 30.0


@pytest.fixture
def lab(request: pytest.FixtureRequest) -> Iterator[LabState]:
    """`_lab.lab` with eBPF tcp_flows on every agent, unless the test is marked
    `without_tcp_flows`."""
    plain = request.node.get_closest_marker("without_tcp_flows") is not None
    yield from lab_for(request, control.DEFAULT_COLLECTORS + (() if plain else ("tcp_flows",)))


def busiest_link(st: LabState, rid: str) -> str:
    return next(iter(runs.link_load(st, rid)))


# what the ring's connections into a leaf move through a link in 2 s: megabytes (its step
# carries 4 MiB per rank); the fabric's other traffic (C4P's and C4D's probes) kilobytes
CROSSED_BYTES = 1 << 20


def singled_out_link(st: LabState, rid: str) -> str:
    """The busiest link the job's connections single out (runs.singled_out): where an
    outage's timeouts come from hosts under two leaves or more, whose own counter shows the
    job's traffic entering its leaf now. Fails when there is none: a link only one leaf's
    connections reach their leaf through is a tie no end-to-end observer breaks (two CI
    runs, C4P applying its plans: the plan left no link singled out, the test fell back to
    leaf00-spine00, which only leaf03 -> leaf00 connections crossed, and C4D opened nothing)."""
    load = runs.link_load(st, rid)
    alone = runs.singled_out(st, rid, load)
    seen = {}
    for lk in sorted(alone, key=lambda lk: (-len(load[lk]), lk)):
        seen[lk] = into_leaf_bytes(st, lk)
        if seen[lk] >= CROSSED_BYTES:
            print(f"{lk}: {seen[lk]} bytes into its leaf in 2 s; the job's connections it carries "
                  f"by link_load: {load[lk]}")
            return lk
    pytest.fail(f"no link the job's connections single out shows them (link_load: {load}; "
                f"singled out: {sorted(alone)}; bytes into its leaf in 2 s: {seen})")


def job_and_link(st: LabState, fault: dict) -> str:
    """What a fault nothing named did: the ring's longest pause between steps after it (a
    blackhole stalls it for seconds) and its link's ends' state now."""
    out = []
    for rid in st.data.get("runs", {}):
        _, info = runs.run_info(st, rid)
        t = [s["t"] for s in read_steps(info["dir"])
             if "step" in s and s["t"] >= fault["injected"] - 5] + [time.time()]
        gaps = [b - a for a, b in zip(t, t[1:])]
        out.append(f"run {rid}: {len(t) - 1} steps from 5 s before the fault, longest pause "
                   f"{max(gaps, default=0.0):.1f} s, the last {gaps[-1] if gaps else 0:.1f} s")
    if fault.get("link") in st.fabric().wires:
        w = st.fabric().wires[fault["link"]]
        for end in (w.a, w.b):
            with netns.open_ns(end.ns) as ipr:
                link = ipr.get_links(ifname=end.ifname)[0]
                out.append(f"{end.ns}/{end.ifname}: {link.get_attr('IFLA_OPERSTATE')}")
    return "; ".join(out)


def _named_alone(st: LabState, fault: dict, within: float) -> None:
    # the incident may name it a little after the target: wait longer, then judge the time
    try:
        inc, took = wait_named(st, fault, within + 20)
    except BaseException:  # pytest.fail's: say what the job and the link did meanwhile
        print(job_and_link(st, fault))
        raise
    print(f"{fault['kind']} on {fault['target']} named in {took:.1f} s:", inc["summary"])
    assert took <= within, f"{fault['kind']} named after {took:.1f} s (target {within:.0f} s)"
    others = others_open(st, inc)
    assert not others, describe(others)


# Loss both ways (5 %), C4P applying its plans. After a plan the busiest link may carry only
# connections between its leaf and one other, all crossing the same spine both ways (a CI
# run): the two cables to that spine explain them alike, and C4D names the lossy one by
# measuring both (probes.py; before, such a tie named nothing).
def test_loss_on_a_fabric_link_names_the_link(lab: LabState, steady: str) -> None:
    f = faults.inject(lab, "loss", busiest_link(lab, steady), {"percent": 5.0, "direction": "both"})
    _named_alone(lab, f, LINK_S)


# Slow (10 Mbit/s both ways), C4P applying: the same tie (a CI run: the loss detector at 0.50
# for each end, nothing named in 50 s) is measured, the legs across the slow cable queueing.
def test_slow_fabric_link_names_the_link(lab: LabState, steady: str) -> None:
    f = faults.inject(lab, "slow", busiest_link(lab, steady), {"mbit": 10.0})
    _named_alone(lab, f, LINK_S)


# Link down (lab/faults.py's convergence delay, converge_s = 3 s: the routes are withdrawn
# fabric-wide 3 s after the link fails): the connections other leaves still hash through the
# dead link are blackholed until then; their senders count ACK timeouts (RTOs) and the ring's
# stall messages show them in SendWait. C4D's outage detector (aggregator/diagnosis/outage.py)
# names the link from those before any hang threshold: bench/lab --record, 4 of 4 in 2-4 s.
# It needs several sending hosts blackholed through the link, with paths that separate its
# two ends: the fault hits the busiest link the job's connections single out. On the ring's
# own ports (C4P proposes only): C4P's plans left no such link in two CI runs (each leaf's
# connections from one other leaf all on one spine), and what one leaf pair crosses only
# probes separate, slowly, as the lone flap below.


@pytest.mark.fixed_paths
def test_fabric_link_down_names_the_link(lab: LabState, steady: str) -> None:
    f = faults.inject(lab, "down", singled_out_link(lab, steady), {})
    _named_alone(lab, f, LINK_S)


@pytest.mark.fixed_paths
@pytest.mark.without_tcp_flows
def test_a_down_link_one_leaf_reaches_its_leaf_by_is_named(
        lab: LabState, steady: str) -> None:
    """A link whose traffic into its leaf comes from one other leaf (as C4P's plan left the
    link two CI runs took down, and saw no incident at all): the
    blackholed connections cross both ends of their path alike. With eBPF tcp_flows the way
    their acks took breaks the tie (outage._blackhole: this link named in 2.7 s locally);
    without it, the tie is an unlocalised finding with the two cables as candidates
    (outage._tie), and the measuring legs see the down cable's leaf no longer forward to the
    spine while the other leaf still does (probes.py, signal `down`)."""
    topo = lab.fabric().topology
    one = sorted((lk for lk, pairs in down_pairs(lab, steady).items()
                  if len({topo.host_leaf(a) for a, _ in pairs}) == 1
                  and len({a for a, _ in pairs}) >= 2))
    if not one:
        pytest.skip("no link carries one other leaf's connections alone, from 2 hosts")
    f = faults.inject(lab, "down", one[0], {})
    inc, took = wait_named(lab, f, LINK_S + 20)
    print(f"down on {one[0]} named in {took:.1f} s:", inc["summary"],
          inc["evidence"].get("probe") or inc["evidence"].get("symptoms"))
    # the ring's hang may hold the incident (a CI run: comm_hang naming the link in 17.6 s,
    # the measured finding among its symptoms)
    assert took <= LINK_S


# Flap (1 s down / 3 s up): each down phase stalls the ring too briefly for a stall message,
# and the NICs' ACK timeouts alone tie between the link and the one at the other end of the
# same ring paths; every flow whose path crosses the link retransmits in each phase (eBPF
# tcp_flows), which separates them: replays of 2 recorded flaps named in 6.5 and 7.7 s. That
# needs several hosts' flows on the link, as a link down does (above): a link they single out.
# (The busiest after C4P's plan: named by nothing in 50 s in 1 of 2 local runs.) The ring's
# own ports, as the down above.


@pytest.mark.fixed_paths
def test_flapping_fabric_link_names_the_link(lab: LabState, steady: str) -> None:
    f = faults.inject(lab, "flap", singled_out_link(lab, steady), {"down_s": 1.0, "up_s": 3.0})
    _named_alone(lab, f, LINK_S)


@pytest.mark.fixed_paths
def test_a_flap_only_one_host_crosses_is_named_by_measuring(lab: LabState, steady: str) -> None:
    """The down link of a lone host pair (the default ring: node005 -> node007 down
    leaf03-spine01): only that pair times out (node005, and node007 on its replies' acks),
    so nothing separates the links of its path (outage.py names the path; before, nothing)
    and the measuring probes see the down phases: the leg from leaf03 finds no port to
    spine01 (signal `down`; 2026-12-07, named in 58 s). Loss does not separate the legs:
    spine01 polices its ICMP and the ring's blackholed traffic spends it, so the leg from
    leaf02 lost as much (1,319 of 4,800; 1,345 of 4,000). Until 2026-12-07 the lab's flap
    came up after 30-40 ms, and a CI run saw nothing named in 150 s. A plan moving the ring's
    connections would change which pairs cross the link: C4P only proposes here."""
    lone = sorted(lk for lk, pairs in down_pairs(lab, steady).items() if len(pairs) == 1)
    if not lone:
        pytest.skip("every down link carries several host pairs in this run")
    f = faults.inject(lab, "flap", lone[0], {"down_s": 1.0, "up_s": 3.0})
    # no target for a lone link's flap: the probes must catch its 1 s phases in a round's
    # port choice twice
    inc, took = wait_named(lab, f, 150)
    print(f"named in {took:.1f} s:", inc["evidence"]["probe"])
    assert inc["evidence"]["probe"]["named"] == lone[0], inc["evidence"]


def test_nic_down_names_the_nic(lab: LabState, steady: str) -> None:
    f = faults.inject(lab, "nicdown", "node005", {})
    _named_alone(lab, f, LINK_S)


def test_hung_rank_names_its_host(lab: LabState, steady: str) -> None:
    f = faults.inject(lab, "hang", "3", {})
    _named_alone(lab, f, HANG_S)


def test_straggler_names_the_rank(lab: LabState, steady: str) -> None:
    f = faults.inject(lab, "straggler", "6", {"cpu": 2.0})
    _named_alone(lab, f, STRAGGLER_S)

"""Fixtures and helpers for the lab's root tests: a lab built and torn down per test, the ring
job, and waiting for the incident that names an injected fault."""
from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from c4.core.topology import Topology
from c4.lab import api, control, netns, runs
from c4.lab.state import LabState


def down_pairs(st: LabState, rid: str) -> dict[str, set[tuple[str, str]]]:
    """Fabric link -> the host pairs whose connections cross it spine=>leaf now."""
    _, info = runs.run_info(st, rid)
    fab = st.fabric()
    out: dict[str, set[tuple[str, str]]] = {}
    conns = runs.connections(info["dir"])
    for c, spine in zip(conns, runs.conn_spines(fab, Path(info["dir"])).values()):
        src, dst = fab.nic_of_addr(c["saddr"]), fab.nic_of_addr(c["daddr"])
        assert src is not None and dst is not None
        hops = [lk for lk in fab.path(src, dst, spine)
                if fab.topology.links[lk].kind == "fabric"]
        if len(hops) == 2:
            out.setdefault(hops[1], set()).add((src.host, dst.host))
    return out


def into_leaf_bytes(st: LabState, link: str, seconds: float = 2.0) -> int:
    """Bytes a fabric link delivered to its leaf over `seconds`, read from the leaf end's own
    counter: the traffic a down link blackholes (what its own leaf sends reroutes at once)."""
    fab = st.fabric()
    w, lk = fab.wires[link], fab.topology.links[link]
    end = w.a if fab.topology.switches[lk.a].tier == "leaf" else w.b

    def rx() -> int:
        with netns.open_ns(end.ns) as ipr:
            return int(ipr.get_links(ifname=end.ifname)[0].get_attr("IFLA_STATS64")["rx_bytes"])

    before = rx()
    time.sleep(seconds)
    return rx() - before


def small_topology(tmp_path: Path) -> str:
    """4 hosts of one NIC under 2 leaves, 2 spines: node000 and node001 under leaf00."""
    path = tmp_path / "small.json"
    Topology.leaf_spine(4, gpus_per_host=1, leaves=2, spines=2, nics_per_host=1, nic_gbps=0.4,
                        fabric_gbps=0.1).save(path)
    return str(path)


def new_prefix() -> str:
    return "t" + secrets.token_hex(3)


def lab_for(request: pytest.FixtureRequest,
            collectors: tuple[str, ...] = control.DEFAULT_COLLECTORS) -> Iterator[LabState]:
    """The default lab (8 hosts, 4 leaves, 2 spines), removed whatever the test did. C4P
    applies its plans on their own, as `c4 lab up` does, unless the test is marked
    `fixed_paths`."""
    prefix = new_prefix()
    auto = request.node.get_closest_marker("fixed_paths") is None
    try:
        yield control.up(None, prefix, collectors, auto_apply=auto)
    finally:
        control.down(prefix)


@pytest.fixture
def lab(request: pytest.FixtureRequest) -> Iterator[LabState]:
    yield from lab_for(request)


@pytest.fixture
def ring(lab: LabState) -> Iterator[str]:
    """The ring job stepping (warmed up: the aggregator has its pace and baseline)."""
    rid = runs.start_ring(lab, steps=0, payload=4 << 20, compute_ms=20, channels=2)
    _, info = runs.run_info(lab, rid)
    runs.wait_steps(Path(info["dir"]), 6, 90, info)
    yield rid


# A false incident on the clean ring resolves resolve_hold_s (60 s) after its symptom, and C4P
# may re-plan around it first (its settle_s, 30 s, then REST_HOLD_S): a straggler test waited
# 171 s for one opened after C4P's first plan (comm_slow on leaf01-spine01, as in a CI run)
REST_MAX_S = 300.0


@pytest.fixture
def steady(lab: LabState, ring: str) -> str:
    """The ring job once C4P is at rest and no incident is open (lab/api.py's `wait_rest`).
    An incident opened before any fault is a false one: shown (with -s, or when the test
    fails) for bench/lab --watch to chase; the test goes on once it has resolved."""
    ok, waited, view, open_ = api.wait_rest(lab, REST_MAX_S)
    if not ok:
        pytest.fail(f"not at rest after {waited:.0f} s: incidents open before any fault: "
                    f"{describe(open_)}; plan view: {json.dumps(view)[:2000]}")
    print(f"at rest after {waited:.0f} s, last plan:", view["last_plan"])
    false = api.incidents(lab)
    if false:
        print(f"{len(false)} incident(s) before any fault:", describe(false))
    return ring


def describe(incs: list[dict[str, Any]]) -> str:
    """Incidents as a failure shows them: the syndrome, with the evidence to diagnose it."""
    return json.dumps([{k: i.get(k) for k in ("class", "summary", "suspects", "detected",
                                              "localised", "evidence")} for i in incs])[:4000]


def names(inc: dict[str, Any], fault: dict[str, Any]) -> bool:
    t = api.top(inc)
    accept = set(fault["expect"]["accept"])
    if fault["expect"]["kind"] == "rank" and t.get("rank") is not None:
        return str(t["rank"]) in accept
    return t.get("id") in accept


def wait_named(st: LabState, fault: dict[str, Any], timeout: float) -> tuple[dict[str, Any], float]:
    """The localised incident naming the fault's component and the seconds from injection;
    fails with every incident seen (the syndrome) when none does in time."""
    deadline = time.monotonic() + timeout
    seen: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        seen = api.incidents(st)
        for inc in seen:
            if inc.get("localised") and names(inc, fault):
                return inc, inc["localised"] - fault["injected"]
        time.sleep(0.5)
    pytest.fail(f"{fault['kind']} on {fault['target']}: no localised incident named "
                f"{fault['expect']['id']} within {timeout:.0f} s; incidents: {describe(seen)}")


def others_open(st: LabState, inc: dict[str, Any]) -> list[dict[str, Any]]:
    return [i for i in api.incidents(st, "open") if i["id"] != inc["id"]]

"""Fixtures and helpers for the lab's root tests: a lab built and torn down per test, the ring
job, and waiting for the incident that names an injected fault."""
from __future__ import annotations

import json
import secrets
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from c4.lab import control, runs
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


# C4P's hold-down after a plan (aggregator.toml [planning] settle_s, the lab keeps the default)
SETTLE_S = 30.0


def plan_view(st: LabState) -> dict[str, Any]:
    with urllib.request.urlopen(f"{st.api}/api/v1/plan", timeout=10) as r:
        return dict(json.loads(r.read()))


def at_rest(view: dict[str, Any], now: float) -> bool:
    """Whether C4P, applying on its own, is done moving the job: it knows what the links carry
    now, its proposal would not be applied, and the last plan's connections have all
    reconnected and settled."""
    p, last = view.get("proposal"), view.get("last_plan")
    if p is None or p["current_max_util"] is None or p["gains"]:
        return False
    return last is None or (not last["waiting"] and now - last["created"] >= SETTLE_S)


# how long `at_rest` must hold: two periodic proposals (the lab's interval_s, 10 s), long
# enough for young flows (all noise to the planner) to be measured and a gaining plan applied
REST_HOLD_S = 20.0


@pytest.fixture
def steady(lab: LabState, ring: str) -> str:
    """The ring job once C4P is at rest (`at_rest` for REST_HOLD_S; at once with auto_apply
    off): a fault injected on the link the job's connections cross now must not race a
    periodic plan that moves them elsewhere (a flap on a link a plan had just emptied opened
    no incident in CI)."""
    t0 = time.monotonic()
    since: float | None = None
    view = plan_view(lab)
    while view["auto_apply"]:
        now = time.monotonic()
        since = (since or now) if at_rest(view, time.time()) else None
        if since is not None and now - since >= REST_HOLD_S:
            break
        if now - t0 > 180:
            pytest.fail(f"C4P not at rest after 180 s: {json.dumps(view)[:3000]}")
        time.sleep(2.0)
        view = plan_view(lab)
    print(f"C4P at rest after {time.monotonic() - t0:.0f} s, last plan:", view["last_plan"])
    return ring
def incidents(st: LabState, state: str | None = None) -> list[dict[str, Any]]:
    q = f"?state={state}" if state else ""
    with urllib.request.urlopen(f"{st.api}/api/v1/incidents{q}", timeout=5) as r:
        return list(json.loads(r.read())["incidents"])


def top(inc: dict[str, Any]) -> dict[str, Any]:
    return inc["suspects"][0] if inc.get("suspects") else {}


def names(inc: dict[str, Any], fault: dict[str, Any]) -> bool:
    t = top(inc)
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
        seen = incidents(st)
        for inc in seen:
            if inc.get("localised") and names(inc, fault):
                return inc, inc["localised"] - fault["injected"]
        time.sleep(0.5)
    pytest.fail(f"{fault['kind']} on {fault['target']}: no localised incident named "
                f"{fault['expect']['id']} within {timeout:.0f} s; incidents: "
                + json.dumps([{k: i.get(k) for k in ("class", "summary", "suspects", "localised",
                                                     "evidence")} for i in seen])[:4000])


def others_open(st: LabState, inc: dict[str, Any]) -> list[str]:
    return [f"{i['class']}: {i['summary']}" for i in incidents(st, "open") if i["id"] != inc["id"]]

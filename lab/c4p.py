"""C4P on the lab: colliding flows, the plan that spreads them, and what the fabric and the job
show before and after (`make demo`, tests/root/test_lab_planning.py; docs/lab.md).

`collide()` starts a ring job between two hosts on different leaves with two channels: each
rank's two connections go to the same peer, and the lab binds both to source ports that the
fixed-seed ECMP hash sends over the same spine (the pair's path-map spine), so they collide
deterministically. The agents (with the eBPF tcp_flows collector) report the connections,
the planner has their source hosts trace ports, and `c4 plan apply` gives each connection a
port on its own spine: the agents write the ports into their run_dir's `tcp-ports`, which the
ranks read at the next step boundary and reconnect with.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from . import api, control, netns, runs
from .fabric import Fabric, NicPlan
from .state import LabError, LabState, lab_env
from .workload import connections, read_steps

Say = Callable[[str], None]


def cross_pair(fab: Fabric) -> tuple[NicPlan, NicPlan]:
    """The first two hosts (topology order) under different leaves."""
    nics = [fab.host_nics(h)[0] for h in fab.topology.hosts]
    for a in nics:
        for b in nics:
            if a.leaf != b.leaf:
                return a, b
    raise LabError("C4P needs two hosts under different leaves")


def collide(st: LabState, *, payload: int = 4 << 20, compute_ms: float = 5.0,
            say: Say = lambda s: None) -> str:
    """A ring job whose connections collide: 2 ranks, 2 channels, per direction both
    connections on one spine. Returns the run id (steps until stopped)."""
    a, b = cross_pair(st.fabric())
    return runs.start_ring(st, steps=0, payload=payload, compute_ms=compute_ms, channels=2,
                           buckets=1, hosts=[a.host, b.host], say=say)


def uplink_bytes(fab: Fabric, leaf: str) -> dict[str, int]:
    """Spine -> bytes `leaf` has sent up to it (its fabric interface's tx counter)."""
    out = {}
    with netns.open_ns(fab.ns(leaf)) as ipr:
        links = {ln.get_attr("IFLA_IFNAME"): ln for ln in ipr.get_links()}
        for si, spine in enumerate(fab.topology.spines):
            ln = links.get(f"s{si}")
            if ln is not None:
                out[spine] = int((ln.get_attr("IFLA_STATS64") or {}).get("tx_bytes", 0))
    return out


def uplink_rates(fab: Fabric, leaf: str, seconds: float) -> dict[str, float]:
    """Mbit/s `leaf` sends up to each spine, measured over `seconds`."""
    before = uplink_bytes(fab, leaf)
    time.sleep(seconds)
    after = uplink_bytes(fab, leaf)
    return {s: (after[s] - before.get(s, 0)) * 8 / seconds / 1e6 for s in after}


def steps_since(run_dir: Path, epoch: int, skip: int = 1) -> list[dict[str, Any]]:
    """Steps made on connections of `epoch` or later (the first `skip` of them left out: the
    step that reconnected, and TCP's ramp-up)."""
    s = [x for x in read_steps(run_dir) if "step" in x and x["epoch"] >= epoch and
         not x["reconnected"]]
    return s[skip:]


def wait_steps_since(run_dir: Path, epoch: int, n: int, timeout: float) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = steps_since(run_dir, epoch)
        if len(got) >= n:
            return got[:n]
        time.sleep(0.1)
    raise LabError(f"no {n} steps on epoch {epoch} connections in {timeout:.0f} s "
                   f"(see {run_dir}/rank*.log)")


def median_step(steps: list[dict[str, Any]]) -> float:
    return float(statistics.median(s["step_s"] for s in steps))


def wait_proposal(st: LabState, flows: int, timeout: float) -> dict[str, Any]:
    """The planner's proposal once it plans `flows` flows (reported and traced) and moves
    some, with the current load known (every connection's own 4-tuple traced; a CI run took
    a proposal made while one trace was still out), else at the deadline the last that plans
    and moves them: GET /api/v1/plan, what `c4 plan` shows."""
    deadline = time.monotonic() + timeout
    last: dict[str, Any] = {}
    planning: dict[str, Any] | None = None
    while time.monotonic() < deadline:
        last = api.plan_view(st)
        p = last.get("proposal")
        if p and p["planned"] >= flows and p["moved"]:
            if p.get("current_max_util") is not None:
                return last
            planning = last
        time.sleep(0.5)
    if planning is not None:
        return planning
    raise LabError(f"no proposal planning {flows} flows in {timeout:.0f} s: flows "
                   f"{last.get('flows')}, path map {last.get('pathmap')}, stats "
                   f"{last.get('stats')}, proposal {json.dumps(last.get('proposal'))[:400]}")


def apply_plan(st: LabState) -> dict[str, Any]:
    """`c4 plan apply` as an operator runs it, with the lab's API token."""
    proc = subprocess.run([sys.executable, "-m", "c4.cli", "plan", "apply", "--aggregator",
                           st.api, "--token-file", str(st.dir / "api.token"), "--json"],
                          capture_output=True, text=True, env=lab_env(st.prefix), timeout=30)
    if proc.returncode != 0:
        raise LabError(f"c4 plan apply failed ({proc.returncode}): {proc.stderr.strip()}")
    return dict(json.loads(proc.stdout))


def wait_epoch(run_dir: Path, above: int, timeout: float) -> int:
    """Wait until every connection of the run was made in an epoch above `above`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        conns = connections(run_dir)
        epoch = min((int(c["epoch"]) for c in conns), default=above)
        if epoch > above:
            return epoch
        time.sleep(0.1)
    raise LabError(f"the job did not reconnect within {timeout:.0f} s (see {run_dir}/rank*.log)")


# -------------------------------------------------------------------------- make demo

# Two hosts under two leaves, two spines, 100 Mbit/s fabric links (as the default lab's).
PAIR = {
    "hosts": [{"name": f"node00{i}", "gpus": 1, "nics": [
        {"dev": "mlx5_0", "rail": 0, "leaf": f"leaf0{i}", "gbps": 0.4, "netdev": "eth0"}]}
        for i in range(2)],
    "leaves": ["leaf00", "leaf01"], "spines": ["spine00", "spine01"],
    "links": [{"id": f"{leaf}-{spine}", "a": leaf, "b": spine, "gbps": 0.1, "kind": "fabric"}
              for leaf in ("leaf00", "leaf01") for spine in ("spine00", "spine01")]}


def _rates(r: dict[str, float]) -> str:
    return ", ".join(f"{s} {v:.0f}" for s, v in sorted(r.items())) + " Mbit/s"


def demo(prefix: str, say: Say) -> dict[str, Any]:
    """`make demo`'s C4P step on a lab of its own (2 hosts, agents with eBPF tcp_flows):
    colliding flows, `c4 plan`, `c4 plan apply`, step time and spine load before and after.
    Returns what the summary table shows; `ok` when the flows spread and the step time
    improved at least 1.5x. The lab is removed whatever happens."""
    out: dict[str, Any] = {"ok": False}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(PAIR, f)
    try:
        # the operator pushes the plan here (`c4 plan apply`); with `auto_apply` a periodic
        # plan would go out on its own (tests/root/test_lab_planning_auto.py)
        st = control.up(f.name, prefix, control.DEFAULT_COLLECTORS + ("tcp_flows",),
                        auto_apply=False)
        fab = st.fabric()
        say(f"   lab {prefix}: 2 hosts under leaf00 and leaf01, 2 spines, the agents also "
            "trace TCP connections with eBPF (C4P plans TCP flows from them)")
        rid = collide(st)
        _, info = runs.run_info(st, rid)
        d = Path(info["dir"])
        before = wait_steps_since(d, 0, 8, 90)[2:]
        spines = runs.conn_spines(fab, d)
        rates = uplink_rates(fab, "leaf00", 1.0)
        out["before"] = median_step(before)
        say(f"   ring job, 2 ranks, 2 connections each way: ECMP's hash (fixed seed) put "
            f"{', '.join(f'{c} on {s}' for c, s in sorted(spines.items()))}")
        say(f"   before: step {out['before']:.3f} s; leaf00 uplinks: {_rates(rates)}")
        view = wait_proposal(st, 4, 60)
        say("   the agents reported the connections, the planner had node000 and node001 trace "
            "source ports; `c4 plan` proposes:")
        env = dict(lab_env(prefix), COLUMNS=os.environ.get("COLUMNS", "120"))
        subprocess.run([sys.executable, "-m", "c4.cli", "plan", "--aggregator", st.api,
                        "--links", "4"], env=env, check=False)
        say("   (\"now\": the connections' own 4-tuples, traced on raw sockets by the agents, "
            "placed on the links they take)")
        applied = apply_plan(st)
        say(f"   `c4 plan apply`: {applied['plan_id']}, {applied['assignments']} source ports "
            f"to {', '.join(applied['hosts'])}; the ranks reconnect at the next step boundary")
        epoch = wait_epoch(d, 0, 30)
        after = wait_steps_since(d, epoch, 6, 60)
        spines = runs.conn_spines(fab, d)
        rates = uplink_rates(fab, "leaf00", 1.0)
        out["after"] = median_step(after)
        out["speedup"] = out["before"] / out["after"]
        spread = all(spines[f"r{r}c0"] != spines[f"r{r}c1"] for r in (0, 1))
        say(f"   after: {', '.join(f'{c} on {s}' for c, s in sorted(spines.items()))}")
        say(f"   after: step {out['after']:.3f} s ({out['speedup']:.2f}x faster); leaf00 "
            f"uplinks: {_rates(rates)}")
        out["moved"] = view["proposal"]["moved"]
        out["ok"] = spread and out["speedup"] >= 1.5
    finally:
        os.unlink(f.name)
        control.down(prefix)
    return out

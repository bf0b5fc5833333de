"""Issue 11: the lab's fabric and lifecycle. `down` after a SIGKILLed `up` leaves nothing; two
labs coexist; connections take the path the lab's path map (handed to the aggregator) says;
the ring job steps and reconnects on planned source ports; clean traffic raises no incident."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from c4.lab import api, c4p, cgroups, control, netns, runs
from c4.lab.state import ROOT, LabState, marked_pids
from c4.lab.workload import connections, read_steps, request_reconnect

from ._lab import new_prefix, small_topology

pytestmark = pytest.mark.root
REPO = Path(__file__).resolve().parents[2]


def leftovers(prefix: str) -> dict[str, list]:
    nft = subprocess.run(["nft", "list", "tables"], capture_output=True, text=True).stdout
    groups = [str(r / cgroups.top(prefix)) for r in (cgroups.v2_root(), cgroups.v1_cpu_root())
              if r is not None and (r / cgroups.top(prefix)).exists()]
    return {"namespaces": netns.listed(prefix), "processes": marked_pids(prefix),
            "nft": [ln for ln in nft.splitlines() if "c4lab" in ln], "cgroups": groups,
            "state": [str(ROOT / prefix)] if (ROOT / prefix).exists() else []}


def test_down_after_a_killed_up_leaves_nothing(tmp_path: Path) -> None:
    prefix = new_prefix()
    up = subprocess.Popen([sys.executable, "-m", "c4.cli", "lab", "up", "--prefix", prefix,
                           "--topology", small_topology(tmp_path)], cwd=REPO,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        # kill it once the aggregator and some agents run: the worst moment to die
        while time.monotonic() < deadline:
            try:
                pids = json.loads((ROOT / prefix / "state.json").read_text())["pids"]
            except (OSError, ValueError, KeyError):
                pids = {}
            if pids.get("agents"):
                break
            time.sleep(0.05)
        up.send_signal(signal.SIGKILL)
        up.wait()
        before = leftovers(prefix)
        assert before["namespaces"] and before["processes"], before
    finally:
        control.down(prefix)
    assert leftovers(prefix) == {"namespaces": [], "processes": [], "nft": [], "cgroups": [],
                                 "state": []}


def test_two_labs_coexist_and_down_removes_only_its_own(tmp_path: Path) -> None:
    a, b = new_prefix(), new_prefix()
    topo = small_topology(tmp_path)
    try:
        control.up(topo, a)
        control.up(topo, b)
        status = {s["prefix"]: s for s in control.status()}
        for p in (a, b):
            assert status[p]["phase"] == "up" and status[p]["agents_alive"] == 4
        control.down(a)
        assert not netns.listed(a) and len(netns.listed(b)) == 8
        assert control.status(b)[0]["agents_alive"] == 4
    finally:
        control.down(a)
        control.down(b)


def test_connections_take_the_path_the_map_says(lab: LabState, ring: str) -> None:
    """The lab's path map is what the fabric does: each connection's packets leave its source
    leaf on the uplink to the spine the map names (nftables counters on both uplinks)."""
    fab = lab.fabric()
    topo = lab.topology()
    checked = 0
    for c in connections(runs.run_info(lab, ring)[1]["dir"]):
        a, b = fab.nic_of_addr(c["saddr"]), fab.nic_of_addr(c["daddr"])
        assert a is not None and b is not None
        path = topo.path(a.host, b.host, a.dev, b.dev) or []
        spines = [s for s in topo.spines if f"{a.leaf}-{s}" in path]
        if not spines:
            continue
        ns = fab.ns(a.leaf)
        rules = "".join(
            f"table netdev c4lab_pt{i} {{\n chain c {{\n  type filter hook egress device "
            f"\"s{i}\" priority 0;\n  tcp sport {c['sport']} counter\n }}\n}}\n"
            for i in range(len(topo.spines)))
        netns.run(ns, "nft", "-f", "-", input=rules)
        time.sleep(2)
        counts = []
        for i in range(len(topo.spines)):
            out = netns.run(ns, "nft", "list", "table", "netdev", f"c4lab_pt{i}")
            counts.append(int(out.split("packets ")[1].split()[0]))
            netns.run(ns, "nft", "delete", "table", "netdev", f"c4lab_pt{i}")
        want = topo.spines.index(spines[0])
        assert counts[want] > 0 and sum(counts) == counts[want], (c, spines, counts)
        checked += 1
        if checked == 3:
            break
    assert checked == 3


def test_ring_reconnects_on_planned_source_ports(lab: LabState, ring: str) -> None:
    d = runs.run_info(lab, ring)[1]["dir"]
    before = {c["id"]: c for c in connections(d)}
    sports = {"r0c0": 41001, "r3c1": 41002}
    c4p.wait_epoch(Path(d), request_reconnect(d, sports) - 1, 60)
    after = {c["id"]: c for c in connections(d)}
    assert after["r0c0"]["sport"] == 41001 and after["r3c1"]["sport"] == 41002
    assert after["r1c0"]["sport"] == before["r1c0"]["sport"]
    n = len([s for s in read_steps(d) if "step" in s])
    runs.wait_steps(Path(d), n + 3, 60, runs.run_info(lab, ring)[1])  # it goes on stepping
    assert any(s.get("reconnected") for s in read_steps(d))


def test_clean_traffic_raises_no_incident(lab: LabState, ring: str) -> None:
    """Two minutes of the ring job on a healthy fabric (ECMP imbalance, TCP's own losses at
    the tbf queues and all): no incident of any class."""
    time.sleep(float(os.environ.get("C4_LAB_CLEAN_S", "110")))
    d = runs.run_info(lab, ring)[1]["dir"]
    assert len([s for s in read_steps(d) if "step" in s]) > 30
    assert api.incidents(lab) == []

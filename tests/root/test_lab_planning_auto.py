"""C4P on its own (issue 12's policy in aggregator.toml, `auto_apply`, as `c4 lab up` sets it):
the colliding ring job of test_lab_planning.py, and no `c4 plan apply`. The planner traces each
connection's own 4-tuple (agent/probe.py, raw sockets), so it knows what the links carry now;
a periodic plan whose gain beats the demands' noise goes out by itself, the ranks reconnect on
the planned ports and the spines share the traffic. Before the live 4-tuples were traced, the
current utilisation was unknown and no periodic plan was ever applied to TCP flows."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from c4.lab import api, c4p, control, netns, runs

pytestmark = pytest.mark.root


def test_a_periodic_plan_spreads_the_colliding_flows_on_its_own(tmp_path: Path) -> None:
    path = tmp_path / "topology.json"
    path.write_text(json.dumps(c4p.PAIR))
    prefix = "q" + time.strftime("%H%M%S")
    try:
        st = control.up(str(path), prefix, control.DEFAULT_COLLECTORS + ("tcp_flows",),
                        auto_apply=True)
        fab = st.fabric()
        rid = c4p.collide(st)
        _, info = runs.run_info(st, rid)
        d = Path(info["dir"])
        before = c4p.wait_steps_since(d, 0, 6, 90)[2:]
        spines = runs.conn_spines(fab, d)
        for r in ("r0", "r1"):
            assert spines[f"{r}c0"] == spines[f"{r}c1"], spines  # the fixed-seed collision
        epoch = c4p.wait_epoch(d, 0, 120)  # reconnected: a plan went out with nobody asking
        after = c4p.wait_steps_since(d, epoch, 6, 60)
        spines = runs.conn_spines(fab, d)
        for r in ("r0", "r1"):
            assert spines[f"{r}c0"] != spines[f"{r}c1"], spines
        view = api.plan_view(st)
        last = view["last_plan"]
        assert last is not None and last["reason"] == "periodic", last
        speedup = c4p.median_step(before) / c4p.median_step(after)
        assert speedup >= 1.5, (before, after)
        runs.stop_run(st, rid)
    finally:
        control.down(prefix)
        assert not netns.listed(prefix)

"""`c4 plan`: the aggregator's /api/v1/plan route over real HTTP and its rendering."""
from __future__ import annotations

import json
import threading

import pytest

from c4.aggregator.api import Api, NotFound, serve
from c4.aggregator.config import AggregatorConfig
from c4.aggregator.server import build_core
from c4.cli import main
from c4.cli.commands.plan import plan_view
from tests.unit.test_planner_service import colliding, frame, hello, topo_with_addresses


def aggregator(planning: dict | None = None):
    t = topo_with_addresses()
    cfg = AggregatorConfig(db=":memory:", planning=planning or {})
    core = build_core(cfg, db_path=":memory:", topology=t, check_same_thread=False)
    for i, h in enumerate(sorted(t.hosts)):
        core.ingest.diagnosis.observe(frame("hello", h, hello(h, f"10.0.0.{i + 1}")), 0.0)
    api = Api(core.ingest, core.diagnosis, threading.Lock(), lambda: 5.0)
    api.planner = core.planner
    return core, api, t


def crowded_aggregator():
    """Two TCP flows hashed onto one spine uplink, every path known: a proposal moves one."""
    core, api, t = aggregator()
    same = colliding(core.planner, t)
    for sp in list(range(41000, 41016)) + same:
        core.planner.pathmap.learn("node000/mlx5_0", "node002/mlx5_0", "tcp:29500", sp,
                                   t.ecmp_path("node000/mlx5_0", "node002/mlx5_0", "tcp", sp,
                                               29500), 1.0)
    return core, api


def test_plan_route_and_cli_show_current_and_proposed_loads(capsys):
    core, api = crowded_aggregator()
    httpd = serve(api, "127.0.0.1:0")
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        assert main(["plan", "--json", "--aggregator", url]) == 0
        d = json.loads(capsys.readouterr().out)
        p = d["proposal"]
        assert (p["current_max_util"], p["proposed_max_util"], p["moved"]) == (0.4, 0.2, 1)
        top = p["links"][0]
        assert top["link"] == "leaf000-spine00" and top["current"] == 0.4
        assert main(["plan", "--aggregator", url]) == 0
        out = capsys.readouterr().out
        assert "leaf000-spine00" in out and "flows that move (1)" in out
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert "40%" in str(plan_view(d).renderables[1])


def test_planning_off_without_a_topology_is_a_clear_404():
    cfg = AggregatorConfig(db=":memory:")
    core = build_core(cfg, db_path=":memory:", check_same_thread=False)
    assert core.planner is None
    api = Api(core.ingest, core.diagnosis, threading.Lock(), lambda: 5.0)
    with pytest.raises(NotFound, match="planning is off"):
        api.get("/api/v1/plan", {})


def test_plan_apply_needs_the_token_and_queues_plan_frames(capsys, monkeypatch):
    core, api = crowded_aggregator()
    api.token = "s3cret"
    httpd = serve(api, "127.0.0.1:0")
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}"
        monkeypatch.setenv("C4_API_TOKEN", "wrong")
        assert main(["plan", "apply", "--aggregator", url]) == 1
        assert "401" in capsys.readouterr().err
        assert core.planner.outbox == []
        monkeypatch.setenv("C4_API_TOKEN", "s3cret")
        assert main(["plan", "apply", "--json", "--aggregator", url]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["hosts"] == ["node000"] and out["assignments"] == 1
        [(host, kind, body)] = core.planner.take_outbox()
        assert (host, kind, body["plan_id"]) == ("node000", "plan", out["plan_id"])
    finally:
        httpd.shutdown()
        httpd.server_close()

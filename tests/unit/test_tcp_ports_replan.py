"""A re-plan of a TCP connection that an earlier plan placed: the rule that put it on its old
port must go, or the next connect() to that destination takes the old port first."""
from __future__ import annotations

from pathlib import Path

from c4.agent.pathctl import PathControl
from c4.agent.tcp_ports import planned_ports


def plan(pc: PathControl, plan_id: str, epoch: int, moves: list[tuple[str, int, int | None]]) -> None:
    assignments = []
    for aid, sport, old in moves:
        a = {"id": aid, "proto": "tcp", "sport": sport, "dst": "10.0.1.10", "dport": 30000}
        if old is not None:
            a["old_sport"] = old
        assignments.append(a)
    pc.submit({"plan_id": plan_id, "epoch": epoch, "assignments": assignments})


def test_a_replanned_connection_replaces_the_rule_that_placed_it(tmp_path: Path) -> None:
    pc = PathControl(tmp_path, deadline=0.1)  # not started: only the ports file is used
    plan(pc, "plan-1", 1, [("tcp:a", 41001, 50000), ("tcp:b", 41002, 50001)])
    assert planned_ports(pc.ports.path, "10.0.1.10", 30000) == [41001, 41002]
    # the connection now on 41001 (a new flow id) moves again, off a link that went down
    plan(pc, "plan-2", 2, [("tcp:a2", 41007, 41001)])
    assert planned_ports(pc.ports.path, "10.0.1.10", 30000) == [41002, 41007]
    # an assignment without old_sport (a connection the agent never saw placed) only adds
    plan(pc, "plan-3", 3, [("tcp:c", 41009, None)])
    assert planned_ports(pc.ports.path, "10.0.1.10", 30000) == [41002, 41007, 41009]

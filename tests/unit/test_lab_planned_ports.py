"""The lab workload under planned-ports rules (the file libc4-connect.so reads): which source
port each connection dials, and when a rank asks for a reconnect."""
from __future__ import annotations

from c4.lab.workload import planned_sports

D1, D2 = ("10.0.1.10", 30000), ("10.0.2.10", 30000)


def rules(table: dict[tuple[str, int], list[int]]):
    return lambda addr, port: table.get((addr, port), [])


def test_planned_ports_replace_the_lab_pick_in_file_order() -> None:
    assert planned_sports([D1, D1], [40001, 40002], rules({D1: [35000, 35001]})) == [35000, 35001]


def test_a_connection_already_on_a_planned_port_keeps_it() -> None:
    # a re-plan moved only the second connection: the first must not swap onto its port
    got = planned_sports([D1, D1], [35000, 35001], rules({D1: [35000, 35009]}))
    assert got == [35000, 35009]
    got = planned_sports([D1, D1], [35001, 35000], rules({D1: [35000, 35001]}))
    assert got == [35001, 35000]  # a permutation is not a change: no reconnect


def test_destinations_without_rules_and_spare_connections_keep_their_ports() -> None:
    assert planned_sports([D1, D2], [40001, 40002], rules({D1: [35000]})) == [35000, 40002]
    assert planned_sports([D1, D1], [40001, 40002], rules({D1: [35000]})) == [35000, 40002]
    assert planned_sports([D1], [40001], rules({})) == [40001]

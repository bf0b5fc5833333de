"""One fault, one incident, while its evidence grows (issue 13; CI's lab straggler test at
stop 20 failed on it): a rank starved of CPU slows its own sends at once and the
acknowledgements of what it receives less. C4D named the cable its sends alone take, or a
fabric link, then the host once its incoming connections were slow enough, and both
incidents stayed open. The later finding explains every connection of the earlier one: it is
the same fault, better named.

The job is test_diag_share's ring on the lab's fabric, with two channels (each rank sends to
the ranks one and two ahead and behind, as the lab's ring with channels=2 does: one peer on
its own leaf)."""
from __future__ import annotations

from pathlib import Path

from .test_diag_share import HOSTS, Conn, leaf, named, run

STARVED = 6
CONNS = [(r, (r + k) % 8) for r in range(8) for k in (1, -1, 2, -2)]
# what the starved rank receives from other leaves comes down spine00, everything else on its
# leaf down spine01
PLAN = {(s, d): "spine00" if d == STARVED else "spine01" if leaf(d) == leaf(STARVED) else
        f"spine0{(s + d) % 2}" for s, d in CONNS}
START = 20  # s


def starved(t: int, c: Conn) -> float:
    """Its sends 4x slower; what it receives from other leaves 2x (a longer round trip holds
    more of its late acknowledgements), from its leaf neighbour not measurably."""
    if t < START:
        return 1.0
    if c[0] == STARVED:
        return 4.0
    return 2.0 if c[1] == STARVED and leaf(c[0]) != leaf(STARVED) else 1.0


def test_a_fault_whose_evidence_grows_is_one_incident_naming_the_host(tmp_path: Path) -> None:
    """Before: two open incidents in both seeds, the up direction of node006's cable (its
    four sends) and node006 (six or seven connections)."""
    for seed in (1, 2):
        incidents = run(tmp_path, [(0, PLAN, {})], duration=80, slower=starved, seed=seed)
        live = [i for i in incidents if "merged_into" not in i["evidence"]]
        assert named(live) == [HOSTS[STARVED]], [(i["state"], i["summary"]) for i in incidents]
        assert all(i["evidence"]["merged_into"] == live[0]["id"]
                   for i in incidents if i not in live)


def test_an_earlier_narrower_naming_is_renamed(tmp_path: Path) -> None:
    """What it receives slows 12 s after its sends: the up direction of node006's cable is
    named first (its four sends, all it carries), then node006 explains those and more: the
    same incident now names node006. Before: both stayed open."""

    def late(t: int, c: Conn) -> float:
        return starved(t, c) if c[0] == STARVED or t >= START + 12 else 1.0

    for seed in (1, 2):
        incidents = run(tmp_path, [(0, PLAN, {})], duration=80, slower=late, seed=seed)
        assert named(incidents) == [HOSTS[STARVED]], [(i["state"], i["summary"])
                                                       for i in incidents]

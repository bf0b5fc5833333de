"""Measuring probes on the lab (real aggregator, agents, netns fabric and nftables loss): loss
on the down direction spine=>leaf of a link that only one host pair of the ring crosses that
way. What goes down it came up the other leaf's link to the same spine, and the ring's
connections alone cannot say which of the two loses; the agents' TTL-limited datagrams to the
spine from under each leaf do (aggregator/diagnosis/probes.py)."""
from __future__ import annotations

import pytest

from c4.lab import faults
from c4.lab.state import LabState

from ._lab import down_pairs, wait_named

pytestmark = pytest.mark.root


@pytest.mark.fixed_paths  # a C4P plan would change which pairs cross the link
def test_loss_down_a_lone_pairs_link_is_named_by_measuring(lab: LabState, ring: str) -> None:
    lone = sorted(lk for lk, pairs in down_pairs(lab, ring).items() if len(pairs) == 1)
    # (the default lab's ring crosses one down link with a single host pair: leaf03-spine01)
    if not lone:
        pytest.skip("every down link carries several host pairs in this run")
    f = faults.inject(lab, "loss", lone[0], {"percent": 3.0, "direction": "ba"})
    inc, took = wait_named(lab, f, 90)
    print(f"named in {took:.1f} s:", inc["evidence"].get("probe"))
    # the probes named it: before them this was the path node005->node007 at 0.10
    assert inc["evidence"]["probe"]["named"] == lone[0]
    assert inc["evidence"]["direction"] == f"towards {lone[0].split('-')[0]}"

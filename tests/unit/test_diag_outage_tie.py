"""C4D's outage detector when the evidence ties between the two ends of the same paths and a
bystander flow would break the tie (aggregator/diagnosis/outage.py). The recording
(tests/fixtures/lab/03-down-leaf02-spine01: `bench/lab --record`, the ring job on the default
8-host fabric, eBPF agents, trimmed to 20 s after the fault) is leaf02-spine01 taken down
while only leaf01's connections sent towards leaf02 through it: two leaf01 -> leaf02 flows
retransmitted at the ACK timeouts in 3 and 4 reports and two connections were stuck in a stall
message, all crossing leaf01-spine01 and leaf02-spine01 alike; one leaf01 -> leaf00 flow of
node003 (whose flow through the down link retransmitted in 4 reports) retransmitted in 2, at
the fault and as the ring resumed, and crossed leaf01-spine01 only. Before the fix the
outage detector took it as evidence and named leaf01-spine01 at 0.99, 9 s after the fault."""
from __future__ import annotations

from pathlib import Path

from tests.unit.test_diag_outage import named_after, run, unpack


def test_a_bystander_flow_does_not_break_the_tie_towards_the_wrong_end(tmp_path: Path) -> None:
    rec, truth = unpack("03-down-leaf02-spine01", tmp_path)
    incidents = run(rec, truth)
    assert not [i for i in incidents if "ACK timeouts" in i["summary"]], incidents
    # nothing but the downed link is named: which end of the paths, the evidence cannot tell
    assert set(named_after(incidents, truth)) <= {"leaf02-spine01"}, incidents

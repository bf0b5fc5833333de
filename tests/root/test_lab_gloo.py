"""Issue 11: a real job nobody here wrote. PyTorch DDP over gloo across the lab's hosts, no
plugin; C4D finds faults in it from the agents' eBPF tcp_flows alone."""
from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from c4.lab import control, faults, runs
from c4.lab.state import LabState

from ._lab import describe, new_prefix, others_open, wait_named

pytestmark = pytest.mark.root
torch = pytest.importorskip("torch", reason="the lab extra (torch) is not installed")


@pytest.fixture
def gloo() -> Iterator[tuple[LabState, str]]:
    prefix = new_prefix()
    try:
        st = control.up(None, prefix, control.DEFAULT_COLLECTORS + ("tcp_flows",))
        rid = runs.start_gloo(st, steps=0)
        _, info = runs.run_info(st, rid)
        runs.wait_steps(Path(info["dir"]), 8, 240, info)
        yield st, rid
    finally:
        control.down(prefix)


def test_loss_on_a_host_cable_is_found_from_ebpf(gloo: tuple[LabState, str]) -> None:
    st, _ = gloo
    f = faults.inject(st, "loss", "node005/mlx5_0-leaf02", {"percent": 5.0, "direction": "both"})
    inc, took = wait_named(st, f, 60)
    assert inc["evidence"].get("transport") == "tcp"
    assert took <= 30, f"named after {took:.1f} s"
    others = others_open(st, inc)
    assert not others, describe(others)


def test_hung_rank_is_found_from_ebpf(gloo: tuple[LabState, str]) -> None:
    """SIGSTOP leaves every flow of the job idle; the agent's tcp_flows owners show the rank's
    process stopped (T), and its peers' probes find its receive window closed."""
    st, rid = gloo
    f = faults.inject(st, "hang", "3", {}, rid)
    inc, took = wait_named(st, f, 40)
    assert took <= 10, f"named after {took:.1f} s"
    others = others_open(st, inc)
    assert not others, describe(others)
    ev = inc["evidence"]
    assert (inc["class"], ev["transport"], ev["culprit"]) == ("noncomm_hang", "tcp", "stopped")
    assert ev["culprit_pids"] == [f["pids"]["3"]], ev

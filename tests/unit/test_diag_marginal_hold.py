"""C4D's marginal-slowness rule stays quiet through chance (issue 13: <= 0.05 localised false
incidents per clean hour). tests/fixtures/sim/clean-336835654-800s: 800-935 s of clean seed
336835654 of `bench/diagnosis --adversarial --only clean --clean-hours 20 --big-every 4
--seed 4` (16 ranks, ring, noise 0.08, a 2 s interval; the hosts' hellos moved to the
window's start): the 20-report medians of node002/mlx5_0's two connections crossed the test
(1.07x) in two evaluations, 906 s in, and the NIC was named. A NIC at 90 % stays across it:
tests/unit/test_diag_adversarial.py names one."""
from __future__ import annotations

import lzma
import shutil
from pathlib import Path

from c4.aggregator.replay import replay

SIM = Path(__file__).resolve().parents[1] / "fixtures" / "sim"


def test_a_chance_crossing_of_the_marginal_test_names_nothing(tmp_path: Path) -> None:
    name = "clean-336835654-800s.c4rec"
    rec = tmp_path / name
    rec.write_bytes(lzma.decompress((SIM / f"{name}.xz").read_bytes()))
    shutil.copyfile(SIM / f"{name}.topology.json", f"{rec}.topology.json")
    incidents = replay(rec).incidents
    assert not [i for i in incidents if i["localised"]], [i["summary"] for i in incidents]

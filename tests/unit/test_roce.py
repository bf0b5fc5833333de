"""c4.core.roce against known ports and against the kernel's own C code (tests/verbs/roce_sport.c)."""
from __future__ import annotations

import random
import subprocess

import pytest

from c4.core.roce import rdma_calc_flow_label, rdma_flow_label_to_udp_sport, sport_for_qp
from tests.verbs import harness


@pytest.mark.parametrize("lqpn,rqpn,sport", [(0x1FD2, 0x423C, 55701), (0x100, 0x200, 49160)])
def test_known_pairs(lqpn: int, rqpn: int, sport: int) -> None:
    assert sport_for_qp(lqpn, rqpn, 0) == sport
    assert rdma_flow_label_to_udp_sport(rdma_calc_flow_label(lqpn, rqpn)) == sport


def test_both_ends_of_a_connection_use_the_same_port() -> None:
    assert sport_for_qp(0x423C, 0x1FD2, 0) == sport_for_qp(0x1FD2, 0x423C, 0)


def test_nonzero_flow_label_decides_the_port_alone() -> None:
    fl = 0x12345
    ports = {sport_for_qp(lqpn, rqpn, fl) for lqpn, rqpn in [(1, 2), (0x1FD2, 0x423C), (7, 9)]}
    assert ports == {rdma_flow_label_to_udp_sport(fl)}
    assert rdma_flow_label_to_udp_sport(fl) != sport_for_qp(0x1FD2, 0x423C, 0)


def test_fold_sets_the_top_two_bits() -> None:
    assert rdma_flow_label_to_udp_sport(0) == 0xC000
    assert rdma_flow_label_to_udp_sport(0x4000) == 0xC001  # high bits fold into the low ones
    assert rdma_flow_label_to_udp_sport(0xFFFFF) == 0xC000 | (0x3FFF ^ 0x3F)


def test_flow_label_is_20_bits_of_a_64_bit_product() -> None:
    lqpn = rqpn = 0xFFFFFFFF  # product needs all 64 bits
    assert 0 <= rdma_calc_flow_label(lqpn, rqpn) <= 0xFFFFF


@pytest.fixture(scope="module")
def kernel_oracle() -> str:
    harness.require("build/roce_sport")
    return str(harness.BUILD / "roce_sport")


def test_matches_kernel_code_on_random_inputs(kernel_oracle: str) -> None:
    rng = random.Random(4)
    cases = [(rng.randrange(1 << 24), rng.randrange(1 << 24),
              0 if i % 2 else rng.randrange(1 << 20)) for i in range(20000)]
    cases += [(0xFFFFFFFF, 0xFFFFFFFF, 0), (0, 5, 0), (3, 4, 0x100000), (1, 1, 0xFFFFFFFF)]
    text = "".join(f"{a} {b} {c}\n" for a, b, c in cases)
    out = subprocess.run([kernel_oracle], input=text, capture_output=True, text=True,
                         check=True).stdout.split()
    assert [sport_for_qp(a, b, c) for a, b, c in cases] == [int(x) for x in out]

"""bpf/verbs_qp_abi.h and the collector's enum tables match the real <infiniband/verbs.h>."""
from __future__ import annotations

import re
import subprocess

import pytest

from c4.agent.collectors import verbs_qp
from c4.agent.bpf import BPF_DIR
from c4.core.wire.sections.verbs_qp import QP_STATES
from tests.verbs import harness

HEADER = BPF_DIR / "verbs_qp_abi.h"


@pytest.fixture(scope="module")
def generated() -> str:
    harness.require("build/verbs_abi")
    return subprocess.run([str(harness.BUILD / "verbs_abi")], capture_output=True, text=True,
                          check=True).stdout


def defines(text: str) -> dict[str, int]:
    return {m[1]: int(m[2]) for m in re.finditer(r"^#define (\w+) (\d+)$", text, re.M)}


def test_checked_in_header_is_what_the_real_header_gives(generated: str) -> None:
    assert HEADER.read_text() == generated, "run: make -C tests/verbs abi"


def test_python_enum_tables_match_the_header() -> None:
    d = defines(HEADER.read_text())
    states = {k[len("C4_IBV_QPS_"):]: v for k, v in d.items() if k.startswith("C4_IBV_QPS_")}
    assert {name: i for i, name in enumerate(QP_STATES)} == states
    types = {v: k[len("C4_IBV_QPT_"):] for k, v in d.items() if k.startswith("C4_IBV_QPT_")}
    assert verbs_qp.QP_TYPE_NAMES == types
    assert (verbs_qp.IBV_QP_PORT, verbs_qp.IBV_QP_AV, verbs_qp.IBV_QP_DEST_QPN) == (
        d["C4_IBV_QP_PORT"], d["C4_IBV_QP_AV"], d["C4_IBV_QP_DEST_QPN"])


def test_bpf_stat_names_follow_the_enum_in_the_program() -> None:
    src = (BPF_DIR / "verbs_qp.c").read_text()
    body = src[src.index("enum stat_index"):src.index("ST_COUNT")]
    names = [n.lower() for n in re.findall(r"ST_(\w+),", body)]
    assert tuple(names) == verbs_qp.BPF_STATS

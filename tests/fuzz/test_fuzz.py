"""A short coverage-guided pass of each fuzz target (tests/fuzz/run.py); `make fuzz` runs long
ones. Fails on any crash, with the crashing input's path and the fuzzer's last lines."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("atheris")

from .run import CORPUS, fuzz  # noqa: E402
from .targets import TARGETS  # noqa: E402

SECONDS = 3


@pytest.mark.parametrize("target", TARGETS)
def test_short_fuzz_pass(target: str, tmp_path: Path) -> None:
    assert any((CORPUS / target).iterdir()), "the kept seed corpus is missing"
    r = fuzz(target, SECONDS, tmp_path)
    assert not r.crashed, f"{target} crashed on {r.artifacts}:\n{r.tail}"
    assert r.runs > 0, r.tail

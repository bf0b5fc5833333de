"""The plugin's stall threshold and diagnosis's hang floor share one default
(c4/core/ordinals.py STALL_S_DEFAULT): the C source cannot import it, so this reads it."""
from __future__ import annotations

import re
from pathlib import Path

from c4.aggregator.diagnosis.config import DiagnosisConfig
from c4.core.ordinals import STALL_S_DEFAULT

REPO = Path(__file__).resolve().parents[2]


def test_plugin_stall_default_is_the_shared_one() -> None:
    src = (REPO / "plugin" / "src" / "plugin.c").read_text()
    (ms,) = re.findall(r'env_ms\("C4_STALL_MS",\s*(\d+)', src)
    assert int(ms) == STALL_S_DEFAULT * 1000
    assert DiagnosisConfig().hang_floor_s == STALL_S_DEFAULT
    doc = (REPO / "docs" / "plugin.md").read_text()
    assert f"| `C4_STALL_MS` | `{int(ms)}` |" in doc

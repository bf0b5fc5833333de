"""[diagnosis] config: defaults valid, bad values named, every key documented."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from c4.core.config import ConfigError, build
from c4.aggregator.diagnosis.config import DiagnosisConfig

DOC = Path(__file__).resolve().parents[2] / "docs" / "diagnosis.md"


def test_defaults_build():
    cfg = build(DiagnosisConfig, {}, "diagnosis")
    assert cfg.hang_floor_s > 0 and 0 < cfg.localise_confidence <= 1


@pytest.mark.parametrize("table, why", [
    ({"hang_floor_s": 0}, "diagnosis.hang_floor_s: must be > 0"),
    ({"slow_ratio": 1.0}, "slow_ratio"),
    ({"localise_confidence": 1.5}, "localise_confidence"),
    ({"straggler_persist": 9, "straggler_window": 4}, "straggler_persist"),
    ({"slow_persist": 0}, "slow_persist"),
    ({"no_such_key": 1}, "unknown key"),
    ({"xid_ignore": "13"}, "expected a list"),
])
def test_bad_values_are_rejected_naming_the_key(table, why):
    with pytest.raises(ConfigError, match=why):
        build(DiagnosisConfig, table, "diagnosis")


def test_every_key_has_a_doc_string_and_is_in_docs_diagnosis():
    text = DOC.read_text()
    for f in dataclasses.fields(DiagnosisConfig):
        assert f.metadata.get("doc"), f.name
        assert f"`{f.name}`" in text, f"docs/diagnosis.md does not document {f.name}"

"""The shipped alerting rules load in Prometheus and fire as their unit tests expect."""
from __future__ import annotations

import subprocess
from pathlib import Path

from tests.promtool import promtool

RULES = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"


def test_rules_check_clean() -> None:
    res = subprocess.run([promtool(), "check", "rules", "c4-rules.yml"], cwd=RULES,
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0 and "SUCCESS" in res.stdout, res.stdout + res.stderr


def test_rules_unit_tests_pass() -> None:
    res = subprocess.run([promtool(), "test", "rules", "c4-rules.test.yml"], cwd=RULES,
                         capture_output=True, text=True, timeout=30)
    assert res.returncode == 0, res.stdout + res.stderr


def test_rules_use_only_metrics_c4_exports() -> None:
    """Every c4_* name in a rule is one the exporters define (a renamed metric breaks here)."""
    import re

    src = (RULES / "c4-rules.yml").read_text()
    code = "".join(p.read_text() for p in (
        RULES.parents[1] / "agent" / "exporter.py", RULES.parents[1] / "aggregator" / "metrics.py",
        RULES.parents[1] / "aggregator" / "api.py"))
    for name in set(re.findall(r"\b(c4_[a-z_]+)", src)):
        assert name.removesuffix("_total") in code, name

"""docs/operations.md stays true: its config blocks load, its Prometheus and Alertmanager
configs pass their own checkers, and the systemd-analyze results it quotes are today's."""
from __future__ import annotations

import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from c4.agent.config import AgentConfig
from c4.aggregator.alerts import AlertsConfig
from c4.aggregator.config import AggregatorConfig
from c4.core.config import build
from tests.promtool import promtool

REPO = Path(__file__).resolve().parents[2]
DOC = (REPO / "docs" / "operations.md").read_text()


def blocks(lang: str, first_line: str) -> list[str]:
    found = re.findall(rf"```{lang}\n(.*?)```", DOC, re.S)
    return [b for b in found if b.splitlines()[0].strip() == first_line]


def test_config_blocks_load() -> None:
    agents = blocks("toml", "# /etc/c4/agent.toml")
    aggregators = blocks("toml", "# /etc/c4/aggregator.toml")
    assert agents and len(aggregators) >= 2
    for text in agents:
        build(AgentConfig, tomllib.loads(text), "")
    for text in aggregators:
        data = tomllib.loads(text)
        if "listen" not in data:  # an [alerts] excerpt
            data = {"alerts": data["alerts"]}
        cfg = build(AggregatorConfig, data, "")
        build(AlertsConfig, cfg.alerts, "alerts")


def test_prometheus_config_checks(tmp_path: Path) -> None:
    (text,) = blocks("yaml", "# prometheus.yml")
    cfg = tmp_path / "prometheus.yml"
    cfg.write_text(text.replace("/opt/c4/", f"{REPO}/"))
    res = subprocess.run([promtool(), "check", "config", str(cfg)], capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == 0 and "SUCCESS" in res.stdout, res.stdout + res.stderr


def test_alertmanager_config_checks(tmp_path: Path) -> None:
    amtool = shutil.which("amtool")
    if amtool is None:
        pytest.skip("amtool not installed (Debian prometheus-alertmanager; scripts/setup.sh)")
    (text,) = blocks("yaml", "# alertmanager.yml")
    cfg = tmp_path / "alertmanager.yml"
    cfg.write_text(text)
    res = subprocess.run([amtool, "check-config", str(cfg)], capture_output=True, text=True,
                         timeout=30)
    assert res.returncode == 0 and "SUCCESS" in res.stdout, res.stdout + res.stderr


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_systemd_analyze_results_are_current() -> None:
    """Runs the doc's systemd-analyze commands as written and compares the quoted table."""
    cmds = [line for b in re.findall(r"```sh\n(.*?)```", DOC, re.S) for line in b.splitlines()
            if line.startswith("systemd-analyze ")]
    assert len(cmds) == 3
    table = DOC.split("<!-- systemd-analyze: begin -->")[1].split("<!-- systemd-analyze: end -->")[0]
    for cmd in cmds:
        res = subprocess.run(cmd.split(), cwd=REPO, capture_output=True, text=True, timeout=60)
        out = res.stdout + res.stderr
        if " verify " in cmd:
            assert [line for line in out.splitlines() if line.strip()
                    and "is not executable" not in line] == []
            continue
        unit = Path(cmd.split()[-1]).name
        score = re.search(r"Overall exposure level for \S+: (\d+\.\d) (\w+)", out)
        assert score, out[-500:]
        row = [line for line in table.splitlines() if line.startswith(f"| {unit} ")][0]
        assert row.endswith(f"| {score.group(1)} {score.group(2)} |"), (row, score.group(0))

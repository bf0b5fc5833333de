"""The systemd units start real `c4` subcommands with the paths the code uses by default."""
from __future__ import annotations

import configparser
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from c4.agent.config import AgentConfig
from c4.aggregator.config import AggregatorConfig
from c4.cli import build_parser

UNITS = Path(__file__).resolve().parents[2] / "systemd"


def unit(name: str) -> configparser.ConfigParser:
    cp = configparser.ConfigParser(strict=False, interpolation=None)
    cp.optionxform = str  # type: ignore[assignment,method-assign]  # systemd keys are case-sensitive
    cp.read_string((UNITS / name).read_text())
    return cp


@pytest.mark.parametrize("name, command, config", [
    ("c4-agent.service", ["agent", "run"], "/etc/c4/agent.toml"),
    ("c4-aggregator.service", ["aggregator", "run"], "/etc/c4/aggregator.toml"),
])
def test_exec_start_runs_a_real_subcommand(name: str, command: list[str], config: str) -> None:
    svc = unit(name)["Service"]
    argv = shlex.split(svc["ExecStart"])
    assert argv[0] == "/opt/c4/.venv/bin/c4"  # the console script of the venv docs/operations.md makes
    assert argv[1:3] == command
    args = build_parser().parse_args(argv[1:])
    assert callable(args.func) and args.config == config
    assert (svc["Type"], svc["Restart"], svc["RestartSec"]) == ("notify", "always", "2")
    # sd_notify from the main loop (c4/core/sdnotify.py); a config error (exit 2) is final
    assert int(svc["WatchdogSec"]) >= 10 and svc["NotifyAccess"] == "main"
    assert svc["RestartPreventExitStatus"] == "2"
    for key in ("SystemCallArchitectures", "RestrictSUIDSGID", "RestrictRealtime", "UMask",
                "DevicePolicy"):
        assert svc[key], key


def test_agent_unit_grants_what_ebpf_needs_and_its_run_dir() -> None:
    svc = unit("c4-agent.service")["Service"]
    caps = set(svc["CapabilityBoundingSet"].split())
    assert {"CAP_BPF", "CAP_PERFMON", "CAP_SYS_ADMIN", "CAP_NET_ADMIN", "CAP_SYS_RESOURCE",
            "CAP_SYS_PTRACE"} <= caps
    comments = [line for line in (UNITS / "c4-agent.service").read_text().splitlines()
                if line.startswith("#   CAP_")]
    undocumented = [c for c in caps if not any(c in line for line in comments)]
    assert not undocumented, f"every capability is commented with why: {undocumented}"
    assert svc["LimitMEMLOCK"] == "infinity" and svc["ProtectSystem"] == "strict"
    run_dir = AgentConfig().run_dir
    assert run_dir == Path("/run") / svc["RuntimeDirectory"]
    assert str(run_dir) in svc["ReadWritePaths"].split()


def test_aggregator_unit_is_unprivileged_and_owns_its_database_dir() -> None:
    svc = unit("c4-aggregator.service")["Service"]
    assert svc["DynamicUser"] == "yes" and svc["CapabilityBoundingSet"] == ""
    assert AggregatorConfig().db.parent == Path("/var/lib") / svc["StateDirectory"]


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verify_finds_nothing_but_the_missing_install() -> None:
    units = [str(UNITS / n) for n in ("c4-agent.service", "c4-aggregator.service")]
    res = subprocess.run(["systemd-analyze", "verify", *units], capture_output=True, text=True, timeout=60)
    problems = [line for line in (res.stdout + res.stderr).splitlines()
                if line.strip() and "/opt/c4/.venv/bin/c4 is not executable" not in line]
    assert problems == []

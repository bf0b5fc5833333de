"""Prometheus' own checkers (Debian package `prometheus`, installed by scripts/setup.sh)."""
from __future__ import annotations

import shutil
import subprocess

import pytest


def promtool() -> str:
    exe = shutil.which("promtool")
    if exe is None:
        pytest.skip("promtool not installed (Debian package prometheus; scripts/setup.sh)")
    return exe


def check_metrics(text: str) -> None:
    """`promtool check metrics`: the exposition lints clean (names, types, units, HELP)."""
    res = subprocess.run([promtool(), "check", "metrics"], input=text, capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == 0 and not res.stdout.strip() and not res.stderr.strip(), \
        f"promtool check metrics:\n{res.stdout}{res.stderr}"


def parse(text: str) -> dict[str, float]:
    """`name{labels}` -> value, labels as exposed (sorted by name in prometheus_client)."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out

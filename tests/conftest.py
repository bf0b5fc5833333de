"""Test layout (split by privilege, as pyroute2 does):
- tests/unit: pure tests: captured bytes, fixture trees, no privileges;
- tests/e2e: real processes on loopback (aggregator, agent, CLI), no privileges;
- tests/root: marked `root`: load eBPF, build network namespaces. CI runs them as root.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "/tests/root/" in str(item.fspath):
            item.add_marker(pytest.mark.root)
    if os.geteuid() == 0:
        return
    skip = pytest.mark.skip(reason="needs root (eBPF / network namespaces)")
    for item in items:
        if "root" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


@pytest.fixture
def cluster(tmp_path: Path):
    """A real aggregator and agents as processes on loopback (tests/e2e/procs.py), all
    stopped at the end of the test whatever happened."""
    from tests.e2e.procs import Cluster

    c = Cluster(tmp_path)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def server(tmp_path: Path):
    """A real aggregator (ZeroMQ ingest on loopback, HTTP API, SQLite in tmp_path) serving in
    this process's threads, stopped at the end of the test."""
    from c4.aggregator.config import AggregatorConfig
    from c4.aggregator.server import Server
    from tests.e2e.procs import free_port, serving

    cfg = AggregatorConfig(listen=f"tcp://127.0.0.1:{free_port()}", api="127.0.0.1:0",
                           db=tmp_path / "c4.db", insecure=True)
    with serving(Server(cfg)) as srv:
        yield srv

"""Issue 11: the shipped 16-host and two-rail topologies build, carry the ring job on every
host (on every rail), reach the aggregator, and come down leaving no namespace."""
from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest

from c4.lab import control, netns, runs
from c4.lab.workload import connections

from ._lab import new_prefix

pytestmark = pytest.mark.root


@pytest.mark.parametrize("topology,ranks_per_host", [("hosts16", 1), ("rails2", 2)])
def test_shipped_topology_runs_the_ring(topology: str, ranks_per_host: int) -> None:
    prefix = new_prefix()
    try:
        st = control.up(topology, prefix)
        topo = st.topology()
        rid = runs.start_ring(st, steps=0, payload=1 << 20, compute_ms=5, channels=1,
                              ranks_per_host=ranks_per_host)
        _, info = runs.run_info(st, rid)
        runs.wait_steps(Path(info["dir"]), 3, 120, info)
        nranks = len(topo.hosts) * ranks_per_host
        assert len(info["hosts"]) == nranks
        # every rank's connection leaves by the NIC of its rail (one rank per NIC)
        addrs = {nic.addr for nic in st.fabric().nics.values()}
        conns = connections(info["dir"])
        assert len(conns) == nranks
        assert {c["saddr"] for c in conns} == addrs
        # the aggregator sees every rank of the job
        deadline = time.monotonic() + 30
        ranks = 0
        while time.monotonic() < deadline and ranks < nranks:
            with urllib.request.urlopen(f"{st.api}/api/v1/jobs", timeout=5) as r:
                jobs = json.loads(r.read())["jobs"]
            ranks = max((c["ranks_reporting"] for j in jobs for c in j["comms"]), default=0)
            time.sleep(0.5)
        assert ranks == nranks, jobs
    finally:
        control.down(prefix)
    assert netns.listed(prefix) == []

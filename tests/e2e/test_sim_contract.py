"""The simulator speaks the agent's language: every field path and value type that `c4 sim`
emits must also come out of the real agent code on captured inputs (the golden recording of a
real agent, the agent's hello builder on a fixture sysfs, the rdma collector on it, tcp_flows
on map entries captured from the real eBPF program, nccl from the real plugin under its C
harness).
A field only the simulator sends would let diagnosis work in simulation and fail on hosts."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterable

import pytest

from c4.agent.collectors.base import Context
from c4.agent.collectors.rdma import RdmaCollector
from c4.agent.collectors.tcp_flows import Reporter, detect_features, parse_options, proc_reader
from c4.agent.config import AgentConfig
from c4.agent.daemon import Agent
from c4.agent.sender import Sender
from c4.core import record, wire
from c4.lab.sim import Fault, SimConfig, simulate
from tests.unit.test_tcp_flows_replay import replay

from .plugin_run import hung_ring

REPO = Path(__file__).resolve().parents[2]

# Maps whose keys are data (counter names, collector names, labels), not field names.
DATA_KEYED = ("counters", "deltas", "rates", "health", "collectors", "labels", "unavailable",
              "resets")


def _shape(v: Any, path: str, out: set[tuple[str, str]]) -> None:
    if isinstance(v, dict):
        for k, x in v.items():
            key = "{}" if path.rsplit(".", 1)[-1] in DATA_KEYED else str(k)
            _shape(x, f"{path}.{key}", out)
    elif isinstance(v, list):
        for x in v:
            _shape(x, path + "[]", out)
    else:
        kind = "null" if v is None else "number" if isinstance(v, (int, float)) and not isinstance(v, bool) \
            else type(v).__name__
        out.add((path, kind))


def _frames_shape(frames: Iterable[wire.Frame]) -> set[tuple[str, str]]:
    out: set[tuple[str, str]] = set()
    for f in frames:
        _shape(f.body, f"event:{f.body['type']}" if f.kind == "event" else f.kind, out)
    return out


def _section_shape(name: str, sections: Iterable[Any]) -> set[tuple[str, str]]:
    out: set[tuple[str, str]] = set()
    for s in sections:
        _shape(s, f"report.{name}", out)
    return out


@pytest.fixture(scope="module")
def simulated(tmp_path_factory: pytest.TempPathFactory) -> set[tuple[str, str]]:
    d = tmp_path_factory.mktemp("sim")
    shapes: set[tuple[str, str]] = set()
    for transport, faults in (("nccl", [Fault("xid", "3", 5.0), Fault("hang", "5", 12.0)]),
                              ("tcp", [])):
        out = d / f"{transport}.c4rec"
        simulate(SimConfig(hosts=4, duration=25, transport=transport, faults=faults), out)
        shapes |= _frames_shape(wire.decode(b) for b in record.read(out))
    return shapes


def _nccl_shape(tmp_path: Path) -> set[tuple[str, str]]:
    """The real plugin under its C harness (a ring whose rank 2 hangs: summaries with an op in
    flight, and stall messages) through the real nccl collector."""
    sample = hung_ring(tmp_path, {"LOCAL_RANK": "1", "SLURM_JOB_ID": "4242"})
    out = _section_shape("nccl", [sample.section])
    for ev in sample.events:
        _shape(ev.body(), f"event:{ev.type}", out)
    return out


@pytest.fixture(scope="module")
def real(fixtures_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> set[tuple[str, str]]:
    tmp = tmp_path_factory.mktemp("real")
    shapes = _frames_shape(wire.decode(b) for b in record.read(fixtures_dir / "wire" / "agent.c4rec"))
    sysfs = fixtures_dir / "sysfs" / "mlx5_2dev"
    cfg = AgentConfig(aggregator="tcp://127.0.0.1:9", host="h1", sysfs_root=sysfs, metrics="",
                      run_dir=tmp / "run", labels={"rack": "r1"},
                      collectors={"enabled": ["rdma"], "rdma": {"rails": {"mlx5_0": 0, "mlx5_1": 1}}})
    agent = Agent(cfg, sender=Sender("tcp://127.0.0.1:9", "h1"))
    agent.start_collectors()
    _shape(agent.hello_body(), "hello", shapes)
    agent.sender.close()
    rdma = RdmaCollector(Context(host="h1", sysfs_root=sysfs), {})
    shapes |= _section_shape("rdma", [rdma.collect(100.0).section, rdma.collect(101.0).section])
    capture = json.loads((fixtures_dir / "tcp_flows" / "capture.json").read_text())
    feats = detect_features(fixtures_dir / "tcp_flows" / "tracefs", "6.18.44", 16384)
    # the capture's process is long gone: its owner entry is read from this live one
    rep = Reporter(parse_options({}), feats, lambda pid: 4026531840, job_of=lambda pid: "4242",
                   proc_of=lambda pid: proc_reader(Path("/proc"))(os.getpid()))
    shapes |= _section_shape("tcp_flows", [s.section for s in replay(rep, capture)])
    shapes |= _nccl_shape(tmp)
    return shapes


@pytest.fixture(scope="module")
def fixtures_dir() -> Path:
    return REPO / "tests" / "fixtures"


def test_simulator_sends_nothing_the_agent_does_not(simulated: set[tuple[str, str]],
                                                     real: set[tuple[str, str]]) -> None:
    covered = {p.split(".")[0] if not p.startswith("report.") else ".".join(p.split(".")[:2])
               for p, _ in real}
    extra = sorted((p, t) for p, t in simulated - real
                   if (p.split(".")[0] if not p.startswith("report.") else ".".join(p.split(".")[:2])) in covered)
    assert not extra, "fields only the simulator sends:\n" + "\n".join(f"{p}: {t}" for p, t in extra)


def test_the_contract_covers_what_diagnosis_reads(simulated: set[tuple[str, str]],
                                                  real: set[tuple[str, str]]) -> None:
    """The comparison above is only as good as its coverage: every report section and event
    the simulator sends must have a real counterpart here."""
    tops = {p.split(".")[0] if not p.startswith("report.") else ".".join(p.split(".")[:2])
            for p, _ in simulated}
    real_tops = {p.split(".")[0] if not p.startswith("report.") else ".".join(p.split(".")[:2])
                 for p, _ in real}
    assert tops - real_tops <= {"report.sender"}, sorted(tops - real_tops)

"""C4D for jobs without the NCCL plugin: `c4 sim --transport tcp` jobs (gloo-like, seen only
through eBPF tcp_flows) replayed through the real ingest and diagnosis must have their slow
faults named from per-connection goodput, retransmits and srtt; a clean noisy job raises
nothing; the per-flow state follows the agent's changed-only listing."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import msgpack
import pytest

from c4.aggregator.diagnosis.config import DiagnosisConfig
from c4.lab.evaluate import clock_origin, load_truth, score
from c4.aggregator.diagnosis.model import Model
from c4.aggregator.diagnosis.tcp import TcpDetector
from c4.aggregator.replay import replay
from c4.core import record
from c4.lab.sim import Fault, SimConfig, SimError, simulate
from c4.core.wire.sections.tcp_flows import SECTION

from .test_diag_scenarios import busiest_fabric_link

SIZES = {16: dict(hosts=16, gpus_per_host=2, leaves=4, spines=2),
         64: dict(hosts=64, gpus_per_host=1, leaves=8, spines=4)}


def run(tmp_path: Path, faults: list[str], size: int = 16, **sim: Any):
    out = tmp_path / "tcp.c4rec"
    simulate(SimConfig(faults=[Fault.parse(f) for f in faults], transport="tcp",
                       **SIZES[size], **sim), out)
    res = replay(out)
    truth = load_truth(out)
    return out, res, score(truth, res.incidents, clock_origin(out, truth))


CASES = [(16, "slow-node:node008@15", "s_per_gb"),
         (16, "slow-link:node008,node009@15", "retrans_per_mb"),
         (16, "lossy-link:BUSIEST@15", "retrans_per_mb"),
         (64, "lossy-link:BUSIEST@15", "retrans_per_mb")]


@pytest.mark.parametrize("size, spec, metric", CASES,
                         ids=[f"{s}-{f.split(':')[0]}" for s, f, _ in CASES])
def test_tcp_faults_are_named(tmp_path, size, spec, metric):
    spec = spec.replace("BUSIEST", busiest_fabric_link(size, **SIZES[size], transport="tcp"))
    _, res, sc = run(tmp_path, [spec], size, duration=35, seed=size)
    assert sc.named == 1, sc.misses
    assert sc.false_incidents == 0, sc.wrong
    assert sc.localise_s[0] <= 15.0
    inc = res.incidents[0]
    ev = inc["evidence"]
    assert ev["transport"] == "tcp" and inc["job"] == "train-0"
    m = ev["metrics"][metric]
    assert m["slow"] > 2 * m["baseline"], ev
    assert "TCP connection" in inc["summary"]


def test_clean_noisy_tcp_job_raises_nothing(tmp_path):
    _, res, _ = run(tmp_path, [], duration=240, seed=7, noise=0.1)
    assert res.incidents == []
    [job] = res.jobs
    assert len(job["hosts"]) == 16 and job["flows"] > 0


def test_sim_tcp_rejects_faults_a_tcp_job_cannot_show():
    with pytest.raises(SimError, match="only slow-node"):
        SimConfig(transport="tcp", faults=[Fault.parse("hang:1@5")]).validate()


# -- per-flow state ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> list[dict[str, Any]]:
    """node000's tcp_flows sections from a clean 4-host TCP sim run."""
    out = tmp_path_factory.mktemp("tcp") / "r.c4rec"
    simulate(SimConfig(hosts=4, gpus_per_host=1, leaves=2, spines=2, transport="tcp",
                       duration=5, realism=False), out)
    frames = [msgpack.unpackb(d, raw=False) for d in record.read(out)]
    return [f["body"]["tcp_flows"] for f in frames
            if f["kind"] == "report" and f["host"] == "node000"]


def key(f: dict[str, Any]) -> tuple:
    return (f["saddr"], f["sport"], f["daddr"], f["dport"])


def detector() -> TcpDetector:
    return TcpDetector(DiagnosisConfig(), Model(None))


def test_unlisted_flow_keeps_its_state_until_a_refresh_omits_it(reports):
    det = detector()
    first = reports[0]
    det.on_report("node000", first, 1.0, 1.0)
    assert len(det.flows["node000"]) == len(first["flows"]) >= 2
    kept, *_ = first["flows"]
    changed = copy.deepcopy(reports[1])
    changed.update(refresh=False, unchanged=1)
    changed["flows"] = [f for f in changed["flows"] if key(f) != key(kept)]
    SECTION.check(changed)
    det.on_report("node000", changed, 1.0, 2.0)
    st = det.flows["node000"][key(kept)]
    assert (st.bytes_acked, st.seen) == (kept["bytes_acked"], 1.0)  # its last values
    det.on_report("node000", changed | {"refresh": True, "omitted": 1}, 1.0, 3.0)
    assert key(kept) in det.flows["node000"]  # omitted flows may still exist
    det.on_report("node000", changed | {"refresh": True, "unchanged": 0}, 1.0, 4.0)
    assert key(kept) not in det.flows["node000"]
    assert len(det.flows["node000"]) == len(changed["flows"])


def test_closed_flow_is_forgotten_and_flows_without_job_are_skipped(reports):
    det = detector()
    det.on_report("node000", reports[0], 1.0, 1.0)
    nxt = copy.deepcopy(reports[1])
    nxt["refresh"] = False
    closed, nojob = nxt["flows"][0], nxt["flows"][1]
    closed.update(closed=True, state="CLOSE")
    del nojob["job"]
    SECTION.check(nxt)
    det.on_report("node000", nxt, 1.0, 2.0)
    assert key(closed) not in det.flows["node000"]
    assert key(nojob) not in det.flows["node000"]
    assert det.skipped["no_job"] == 1
    assert len(det.flows["node000"]) == len(nxt["flows"]) - 2


def test_agent_rows_carry_the_owner_job(tmp_path):
    """The agent reads the job id from the owner's environment (agent/jobs.py)."""
    from c4.agent.collectors.tcp_flows import FlowTable
    from c4.agent.jobs import JobResolver

    fixtures = Path(__file__).resolve().parents[1] / "fixtures"
    snap = json.loads((fixtures / "tcp_flows" / "capture.json").read_text())["snapshots"][0]
    live = {int(k): bytes.fromhex(v) for k, v in snap["live"].items()}
    proc = tmp_path / "proc"
    resolver = JobResolver(proc)
    calls: list[int] = []

    def job_of(pid: int) -> str | None:
        calls.append(pid)
        (proc / str(pid)).mkdir(parents=True, exist_ok=True)
        (proc / str(pid) / "stat").write_text(f"{pid} (python3) " + "S " + "0 " * 30)
        (proc / str(pid) / "environ").write_bytes(b"PATH=/bin\0SLURM_JOB_ID=4242\0")
        return resolver.job_of(pid)

    table = FlowTable(100, False, lambda pid: 0, job_of=job_of)
    rows = table.update(live, [], 1.0).flows
    owned = [r for r in rows if r["pid"]]
    assert owned and all(r["job"] == "4242" for r in owned)
    assert all("job" not in r for r in rows if not r["pid"])
    table.update(live, [], 1.0, refresh=True)
    assert len(calls) == len(owned)  # once per flow's owner, not per report
    SECTION.check({"flows": rows, "omitted": 0, "tracked": len(rows), "map_full": 0,
                   "drops": {}, "drops_delta": {}})


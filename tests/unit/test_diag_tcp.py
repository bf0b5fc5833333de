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
        SimConfig(transport="tcp", faults=[Fault.parse("kernel-hang:1@5")]).validate()


# -- hangs -------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["hang", "sigstop"])
def test_stopped_process_of_a_tcp_job_is_named(tmp_path, kind):
    """Every flow of the job goes idle; the agent's owners show the stopped process (T) and
    its peers' probes find its window closed: the host is named at the hang floor."""
    _, res, sc = run(tmp_path, [f"{kind}:6@30"], duration=50, seed=3)
    assert sc.named == 1, sc.misses
    assert sc.false_incidents == 0, sc.wrong
    assert sc.localise_s[0] <= 10.0
    [inc] = res.incidents
    ev = inc["evidence"]
    assert inc["class"] == "noncomm_hang" and inc["job"] == "train-0"
    assert ev["transport"] == "tcp" and ev["culprit"] == "stopped"
    assert ev["process_states"] == {"20000": "T"} and ev["threshold_s"] == 5.0
    assert len(ev["zero_window_from"]) >= 2  # its ring and halving-doubling peers
    assert inc["suspects"][0] == {"kind": "host", "id": "node003", "host": "node003",
                                  "rank": None, "confidence": 0.95}


def test_clean_tcp_job_with_checkpoints_and_restart_raises_nothing(tmp_path):
    """Checkpoints (10-40 s of idle flows, a writer running), start-up and a restart's 20 s
    down time stop every flow of the job: no process is stopped, so they wait for the
    checkpoint allowance (60 s) and never reach it."""
    _, res, _ = run(tmp_path, [], duration=900, seed=3, restart_at=[300.0])
    truth = json.loads((tmp_path / "tcp.c4rec.truth.json").read_text())
    assert {"checkpoint_inside", "restart"} <= {e["kind"] for e in truth["clean_events"]}
    assert res.incidents == []


class Hosts:
    """A 4-host TCP job fed to the detector by hand: each host one flow to each other host."""

    def __init__(self, cfg: DiagnosisConfig) -> None:
        self.det = TcpDetector(cfg, Model(None))
        self.hosts = [f"h{i}" for i in range(4)]
        self.addr = {h: f"10.0.0.{i + 1}" for i, h in enumerate(self.hosts)}
        self.total: dict[tuple[str, str], int] = {}
        self.now = 0.0

    def step(self, moved: int = 4 << 20, states: dict[str, str] | None = None,
             zero_to: str | None = None) -> list[Any]:
        """One interval: every flow moved `moved` bytes; returns the tick's findings."""
        self.now += 1.0
        for h in self.hosts:
            flows = []
            for p in self.hosts:
                if p == h:
                    continue
                self.total[(h, p)] = self.total.get((h, p), 0) + moved
                f = {"saddr": self.addr[h], "sport": 40000, "daddr": self.addr[p],
                     "dport": 29500, "family": "ipv4", "netns": 1, "pid": 100, "comm": "py",
                     "state": "ESTABLISHED", "bytes_acked": self.total[(h, p)],
                     "bytes_received": self.total[(h, p)], "retrans_segs": 0,
                     "bytes_acked_delta": moved, "bytes_received_delta": moved,
                     "retrans_segs_delta": 0, "bytes_acked_rate": float(moved),
                     "bytes_received_rate": float(moved), "srtt_us": 50, "cwnd": 10,
                     "closed": False, "job": "j"}
                if p == zero_to:
                    f.update(zero_window=1, zero_window_delta=1)
                flows.append(f)
            sec = {"flows": flows, "omitted": 0, "tracked": 3, "map_full": 0, "drops": {},
                   "drops_delta": {}, "refresh": True,
                   "owners": [{"pid": 100, "state": (states or {}).get(h, "S"), "job": "j"}]}
            SECTION.check(sec)
            self.det.on_report(h, sec, 1.0, self.now + 0.01 * len(h))
        return self.det.tick(self.now + 0.5)

    def run(self, n: int, **kw: Any) -> list[Any]:
        out: list[Any] = []
        for _ in range(n):
            out = self.step(**kw)
        return out


def hosts(**cfg: Any) -> Hosts:
    h = Hosts(DiagnosisConfig(checkpoint_s=20.0, startup_grace_s=30.0, **cfg))
    h.run(10)  # running: the job's pace is known
    return h


def test_idle_job_without_culprit_is_an_unlocalised_hang_after_the_allowance():
    h = hosts()
    assert h.run(15, moved=0) == []  # a pause shorter than checkpoint_s is a checkpoint
    [f] = h.run(6, moved=0)  # 21 s idle
    assert (f.cls, f.suspects, f.job) == ("comm_hang", [], "j")
    assert f.evidence["pause_allowance_s"] == 20.0 and f.evidence["idle_flows"] == 12
    assert "ambiguous" in f.summary


def test_a_stopped_process_is_named_at_the_hang_floor():
    h = hosts()
    assert h.run(4, moved=0, states={"h2": "T"}) == []
    [f] = h.run(2, moved=0, states={"h2": "T"})
    assert (f.cls, f.suspects[0].id, f.suspects[0].confidence) == ("noncomm_hang", "h2", 0.9)
    assert f.evidence["culprit_pids"] == [100] and f.evidence["threshold_s"] == 5.0


def test_a_stopped_process_with_its_job_moving_is_no_hang():
    """A debugger's stop of a process that shares no collective with the others (or one
    whose flows still drain) is not a stalled job."""
    h = hosts()
    assert h.run(10, states={"h2": "T"}) == []


def test_peers_finding_a_closed_window_name_the_host_after_the_allowance():
    """A host whose process does not read (zero window at its peers) but is not stopped may
    be a checkpoint writer: named once the stall outlasts the allowance, not before."""
    h = hosts()
    assert h.run(15, moved=0, zero_to="h1") == []
    [f] = h.run(6, moved=0, zero_to="h1")
    assert (f.cls, f.suspects[0].id) == ("noncomm_hang", "h1")
    assert f.evidence["culprit"] == "not reading"
    assert f.evidence["zero_window_from"] == ["h0", "h2", "h3"]


def test_a_process_asleep_in_d_through_the_stall_is_named_after_the_allowance():
    h = hosts()
    assert h.run(15, moved=0, states={"h3": "D"}) == []
    [f] = h.run(6, moved=0, states={"h3": "D"})
    assert (f.cls, f.suspects[0].id, f.evidence["culprit"]) == ("noncomm_hang", "h3",
                                                                 "uninterruptible")


def test_start_up_waits_for_the_grace_and_pauses_are_learned():
    h = Hosts(DiagnosisConfig(checkpoint_s=10.0, startup_grace_s=30.0))
    assert h.run(25, moved=0) == []  # loading: no pace yet, startup_grace_s
    h.run(10)
    assert h.det.jobs["j"].pause_s == 0.0  # start-up teaches nothing
    [f] = h.run(15, moved=0)  # longer than checkpoint_s
    assert f.cls == "comm_hang" and f.evidence["pause_allowance_s"] == 10.0
    h.run(5)
    # ... recovered by itself: this job's pauses may last 1.5x as long
    assert h.det.jobs["j"].pause_s == pytest.approx(1.5 * 15, abs=1.5)
    assert h.run(20, moved=0) == []


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


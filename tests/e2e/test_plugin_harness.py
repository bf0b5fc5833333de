"""The NCCL profiler plugin under its C harness, one test per scenario (each NCCL release
2.26-2.30 through its own profiler ABI, and each way NCCL drives a plugin that once broke it),
on a plain, an AddressSanitizer+UBSan and, where it works, a ThreadSanitizer build; then the
harness's workload through the real agent collector."""
from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from c4.agent.collectors.base import Context, Sample
from c4.agent.collectors.nccl import NcclCollector
from c4.core.wire.kinds import validate_body

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "plugin"
BUILD = PLUGIN / "build"

# plugin/tests/harness.c --list; test_every_scenario_is_tested keeps the two in step.
SCENARIOS = ["loader", "release-2.26", "release-2.27", "release-2.28", "release-2.29",
             "release-2.30", "datatypes", "ce", "pxn-unmapped", "pxn-mapped", "single-node",
             "mask", "init-twice", "after-finalize", "finalize-inflight", "agent-stuck", "slow",
             "straggler", "stall", "wide", "exhaust", "flood"]
# (harness, library, environment); the sanitizers run a smaller flood.
BUILDS = {
    "plain": (BUILD / "harness", BUILD / "libnccl-profiler-c4.so", {}, 10_000_000),
    "asan": (BUILD / "asan" / "harness", BUILD / "asan" / "libnccl-profiler-c4.so",
             {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=1",
              "UBSAN_OPTIONS": "print_stacktrace=1"}, 2_000_000),
    "tsan": (BUILD / "tsan" / "harness", BUILD / "tsan" / "libnccl-profiler-c4.so",
             {"TSAN_OPTIONS": "halt_on_error=1:second_deadlock_stack=1"}, 1_000_000),
}


def make(*targets: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-C", str(PLUGIN), *targets], capture_output=True,
                          text=True, timeout=timeout)


@pytest.fixture(scope="module")
def built() -> None:
    proc = make("harnesses")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]


def _tsan_works(tmp_path: Path) -> str | None:
    """None if a threaded TSan program runs here, else why not."""
    src = tmp_path / "t.c"
    src.write_text("#include <pthread.h>\nstatic void *f(void *a) { return a; }\n"
                   "int main(void) { pthread_t t; pthread_create(&t, 0, f, 0);"
                   " return pthread_join(t, 0); }\n")
    for cmd in (["cc", "-fsanitize=thread", "-pthread", str(src), "-o", str(tmp_path / "t")],
                [str(tmp_path / "t")]):
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        if p.returncode != 0:
            return f"{' '.join(cmd)}: {(p.stdout + p.stderr).strip()[-500:]}"
    return None


def test_every_scenario_is_tested(built):
    listed = subprocess.run([str(BUILD / "harness"), "--list"], capture_output=True, text=True,
                            timeout=30, check=True).stdout.split()
    assert listed == SCENARIOS


@pytest.mark.parametrize("variant", list(BUILDS))
@pytest.mark.parametrize("scenario", SCENARIOS)
def test_harness_scenario(built, tmp_path, scenario: str, variant: str):
    if variant == "tsan" and (why := _tsan_works(tmp_path)) is not None:
        pytest.skip(f"ThreadSanitizer does not run on this machine: {why}")
    harness, lib, env, flood = BUILDS[variant]
    proc = subprocess.run([str(harness), "--lib", str(lib), "--scenario", scenario,
                           "--flood", str(flood)], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert f"scenario {scenario}: passed" in out and "harness: all checks passed" in out, out[-6000:]
    assert "FAIL" not in out and "Sanitizer" not in out and "runtime error" not in out, out[-6000:]


@pytest.mark.parametrize("variant", list(BUILDS))
def test_progress_reads_are_consistent(built, tmp_path, variant: str):
    """Summaries' progress (collectives started, completed, the op in flight) read while other
    threads start and complete collectives: every read is one instant's (plugin/tests/progress.c)."""
    if variant == "tsan" and (why := _tsan_works(tmp_path)) is not None:
        pytest.skip(f"ThreadSanitizer does not run on this machine: {why}")
    harness, _, env, _ = BUILDS[variant]
    proc = subprocess.run([str(harness.parent / "progress")], env={**os.environ, **env},
                          capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and " 0 inconsistent" in out, out[-6000:]


@pytest.fixture
def collector(tmp_path):
    c = NcclCollector(Context(host="h", run_dir=tmp_path / "run"), {})
    c.start()
    yield c
    c.close()


def _emit(collector: NcclCollector, *args: str) -> subprocess.CompletedProcess:
    proc = make("all", "build/harness")
    assert proc.returncode == 0, proc.stderr
    env = dict(os.environ, C4_AGENT_SOCKET=str(collector.path), C4_INTERVAL_MS="200",
               C4_STALL_MS="400")
    proc = subprocess.run([str(PLUGIN / "build" / "harness"), "--emit-only", *args], env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc


def _collect_all(collector: NcclCollector, timeout: float = 10.0) -> Sample:
    """Everything the exited harness sent, the final summaries included: one collect() may run
    before the collector's reader thread has taken them off the socket (then it reports an
    earlier summary, mid-collective). A communicator is reported until its final summary has
    been (then it is gone): collect until none is left, the last report of each wins."""
    deadline = time.monotonic() + timeout
    reports: dict[tuple[str, int], dict] = {}
    events: list = []
    while True:
        sample = collector.collect(time.time())
        events += sample.events
        for c in sample.section["comms"]:
            key = (c["comm"], c["rank"])
            if key in reports:  # the interval fields add up
                c["colls"] = reports[key]["colls"] + c["colls"]
                c["peers"] = reports[key]["peers"] + c["peers"]
            reports[key] = c
        if (reports and not sample.section["comms"]) or time.monotonic() > deadline:
            return Sample({**sample.section, "comms": list(reports.values())}, events, 0)
        time.sleep(0.05)


def test_emit_only_through_the_collector(collector):
    _emit(collector, "--seconds", "1.5", "--ranks", "4", "--comm", "c4e2e0000000abcd")
    sample = _collect_all(collector)
    nccl = validate_body("report", {"interval": 1.0, "health": {}, "nccl": sample.section})["nccl"]
    comms = nccl["comms"]
    assert sorted(c["rank"] for c in comms) == [0, 1, 2, 3]
    for c in comms:
        assert c["comm"] == "c4e2e0000000abcd" and c["nranks"] == 4
        assert c["seq_completed"] == c["seq_started"] > 0 and c["inflight"] is None
        assert {(p["peer"], p["dir"]) for p in c["peers"]} == {
            ((c["rank"] + 1) % 4, "send"), ((c["rank"] + 3) % 4, "recv")}
        assert sum(x["count"] for x in c["colls"]) == c["seq_completed"]
    assert nccl["malformed"] == 0 and nccl["dropped"] == 0 and sample.events == []


def test_emit_only_hang_names_the_missing_rank(collector):
    _emit(collector, "--seconds", "2.5", "--ranks", "4", "--hang-rank", "2")
    sample = collector.collect(time.time())
    for ev in sample.events:
        validate_body("event", ev.body())
    stalls = {e.attrs["rank"]: e.attrs for e in sample.events if e.type == "nccl_stall"}
    # rank 2 never entered the op: only its neighbours stall, both waiting on it, on both
    # channels: rank 1 for credit to send, rank 3 for data
    assert sorted(stalls) == [1, 3]
    assert stalls[1]["seq"] == stalls[3]["seq"] == stalls[1]["seq_completed"]
    assert {(w["peer"], w["channel"], w["dir"], w["state"]) for w in stalls[1]["waiting"]} == {
        (2, 0, "send", "SendPeerWait"), (2, 1, "send", "SendPeerWait")}
    assert {(w["peer"], w["channel"], w["dir"], w["state"]) for w in stalls[3]["waiting"]} == {
        (2, 0, "recv", "RecvWait"), (2, 1, "recv", "RecvWait")}
    assert all(w["idle_s"] >= 0.4 for s in stalls.values() for w in s["waiting"])

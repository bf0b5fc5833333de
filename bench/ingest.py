"""Aggregator ingest cost per frame, stage by stage, against plain msgpack decoding.

frames/s and us/frame of each stage on realistic frames, with ratios to the baseline. Prints
numbers; asserts nothing; needs no root.

    .venv/bin/python bench/ingest.py [--quick] [--repeats 3] [--hosts 64] [--sim-seconds 20]
                                     [--mix agent|tcp1000|tcpjob|sim ...]

Stages (each one includes the work of the ones above it):
  unpack      msgpack.unpackb with the limits c4.core.wire.decode passes (the baseline, 1.00x)
  decode      c4.core.wire.decode: unpack + envelope and body schema validation (the DSL)
  decode/C    c4.core.wire.fast.decode: the same, the body validated by msgspec types generated
              from the DSL (what ingest runs)
  ingest/mem  Ingest.handle (dedup, store, host state), SQLite :memory:, no diagnosis
  ingest/wal  the same on an on-disk WAL SQLite (synchronous=NORMAL) in a temp dir
  full        build_core() as `c4 aggregator run` wires it (on-disk WAL db, C4D diagnosis,
              dry-run actions), one transaction per frame
  full/batch  the same, BATCH frames per transaction (Ingest.batch), as the server's drain
  c4d         C4D alone, not cumulative: Diagnosis.observe of build_core() on the frames
              decoded beforehand, a tick per simulated second (what diagnosis adds to full)
The ingest stages call Ingest.handle per frame and Ingest.tick once per simulated second, as
the server does. Times are CPU time (the ingest loop is one thread).
Frame mixes:
  agent    the reports of the golden recording tests/fixtures/wire/agent.c4rec (a real agent
           with the host, rdma and kmsg collectors), after its hello, from --hosts hosts
  tcp1000  reports carrying a tcp_flows section of 1,000 flows, from --hosts / 4 hosts
  tcpjob   the same flows as one TCP job's (gloo): each carries the job id the agent read from
           its owner's environment and runs to another host of the job, whose address its
           hello announced, so C4D tracks every flow (tcp1000's have no job: skipped)
  sim      `c4 sim` frames of 256 hosts x 8 GPUs (2,048 ranks, NCCL summaries, rdma counters)
Each stage runs over the whole stream; the best of --repeats runs is shown (fresh database
and state every run). msgspec.msgpack.decode (untyped) is timed on the same frames too: what
unpacking alone would cost with msgspec instead of msgpack.
"""
from __future__ import annotations

import argparse
import dataclasses
import gc
import logging
import random
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import msgpack
import msgspec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from c4.aggregator.config import AggregatorConfig  # noqa: E402
from c4.aggregator.ingest import Ingest  # noqa: E402
from c4.aggregator.server import build_core  # noqa: E402
from c4.aggregator.state import HostRegistry  # noqa: E402
from c4.aggregator.store import Store, connect  # noqa: E402
from c4.core import record, wire  # noqa: E402
from c4.lab.sim import SimConfig, simulate  # noqa: E402
from c4.core.topology import Topology  # noqa: E402
from c4.core.wire import Frame, fast  # noqa: E402

GOLDEN = ROOT / "tests/fixtures/wire/agent.c4rec"
TCP_FLOWS = 1000
SIM_SHAPE = {"hosts": 256, "gpus_per_host": 8, "leaves": 16, "spines": 8}  # as bench/diagnosis
T0 = 1.7e9
STAGES = ("unpack", "decode", "decode/C", "ingest/mem", "ingest/wal", "full", "full/batch",
          "c4d")
BATCH = 512  # frames per transaction in full/batch (the server drains at most this many)


@dataclass
class Mix:
    name: str
    stream: list[tuple[float, bytes]]  # (arrival time, raw frame) in arrival order
    topology: Any = None

    @property
    def mean_bytes(self) -> float:
        return sum(len(d) for _, d in self.stream) / len(self.stream)


# ------------------------------------------------------------------------------ frame mixes
def resequence(per_host: dict[str, list[Frame]]) -> list[tuple[float, bytes]]:
    """Encode each host's frames with its own boot and seq 1, 2, ... and merge them by ts, so
    ingest stores every frame (no duplicates) in a plausible arrival order."""
    out = []
    for i, (host, frames) in enumerate(per_host.items()):
        boot = f"bench{i:011x}"
        for seq, f in enumerate(frames, 1):
            f = dataclasses.replace(f, host=host, boot=boot, seq=seq, floor=None)
            out.append((f.ts, wire.encode(f)))
    out.sort(key=lambda p: p[0])
    return out


def agent_mix(hosts: int, cycles: int) -> Mix:
    """Each host sends the recording's hello, then its reports over and over."""
    frames = [wire.decode(d) for d in record.read(GOLDEN)]
    hello = next(f for f in frames if f.kind == "hello")
    reports = [f for f in frames if f.kind == "report"]
    span = reports[-1].ts - reports[0].ts + reports[0].body["interval"]
    per_host = {}
    for h in range(hosts):
        # Hosts report out of phase, as agents started at different times do.
        shift = T0 - reports[0].ts + h / hosts
        per_host[f"gpu{h:04d}"] = [dataclasses.replace(hello, ts=T0 - 1.0 + h / hosts)] + [
            dataclasses.replace(f, ts=f.ts + shift + c * span)
            for c in range(cycles) for f in reports]
    return Mix("agent", resequence(per_host))


def tcp_flow(rng: random.Random, host: int, i: int) -> dict[str, Any]:
    """One flow as the tcp_flows collector reports it: an NCCL socket-transport connection."""
    acked, rcvd = rng.randrange(1 << 40), rng.randrange(1 << 40)
    d_acked, d_rcvd = rng.randrange(1 << 30), rng.randrange(1 << 30)
    retrans = rng.randrange(1000)
    return {
        "saddr": f"10.{host >> 8}.{host & 255}.1", "daddr": f"10.{i >> 8 & 255}.{i & 255}.2",
        "sport": 32768 + i, "dport": 43000 + i % 64, "family": "ipv4",
        "netns": 4026531840, "pid": 4242 + i % 8, "comm": "pt_main_thread",
        "state": "ESTABLISHED", "bytes_acked": acked, "bytes_received": rcvd,
        "retrans_segs": retrans, "bytes_acked_delta": d_acked, "bytes_received_delta": d_rcvd,
        "retrans_segs_delta": retrans % 7, "bytes_acked_rate": d_acked / 1.0,
        "bytes_received_rate": d_rcvd / 1.0, "srtt_us": rng.randrange(20, 400),
        "cwnd": rng.randrange(10, 2000), "closed": False, "state_changes": 1,
        "drops": rng.randrange(50), "drops_delta": 0, "cookie": rng.randrange(1, 1 << 40),
    }


def tcp_section(rng: random.Random, host: int) -> dict[str, Any]:
    return {
        "flows": [tcp_flow(rng, host, i) for i in range(TCP_FLOWS)],
        "omitted": 0, "tracked": TCP_FLOWS, "map_full": 0,
        "drops": {"NOT_SPECIFIED": 120, "TCP_OFOMERGE": 8, "NETFILTER_DROP": 3},
        "drops_delta": {"NOT_SPECIFIED": 2},
        "features": ["ringbuf", "rx_sk", "sock_length", "send_reset", "receive_reset"],
    }


def tcp_mix(hosts: int, reports: int) -> Mix:
    rng = random.Random(1)
    per_host = {}
    for h in range(hosts):
        section = tcp_section(rng, h)
        per_host[f"gpu{h:04d}"] = [
            Frame("report", "x", "x", 0, T0 + r + h / hosts,
                  {"interval": 1.0, "health": {"tcp_flows": {"ok": True}},
                   "tcp_flows": section})
            for r in range(reports)]
    return Mix("tcp1000", resequence(per_host))


def tcp_job_mix(hosts: int, reports: int) -> Mix:
    """tcp1000's flows as one job's, between hosts whose hellos announce their addresses."""
    hello = next(f for f in map(wire.decode, record.read(GOLDEN)) if f.kind == "hello")
    rng = random.Random(1)
    per_host = {}
    for h in range(hosts):
        section = tcp_section(rng, h)
        for i, f in enumerate(section["flows"]):
            peer = (h + 1 + i % (hosts - 1)) % hosts
            f.update(job="tcpjob-0", daddr=f"10.{peer >> 8}.{peer & 255}.1")
        body = dict(hello.body, netdevs=[{"name": "eth0",
                                          "addrs": [f"10.{h >> 8}.{h & 255}.1/24"]}])
        per_host[f"gpu{h:04d}"] = [dataclasses.replace(hello, ts=T0 - 1.0 + h / hosts,
                                                       body=body)] + [
            Frame("report", "x", "x", 0, T0 + r + h / hosts,
                  {"interval": 1.0, "health": {"tcp_flows": {"ok": True}},
                   "tcp_flows": section})
            for r in range(reports)]
    return Mix("tcpjob", resequence(per_host))


def sim_mix(seconds: float, tmp: Path) -> Mix:
    out = tmp / "sim.c4rec"
    simulate(SimConfig(**SIM_SHAPE, duration=seconds, seed=1), out)
    topology = Topology.load(tmp / "sim.c4rec.topology.json")
    return Mix("sim", arrival_times(list(record.read(out))), topology)


def arrival_times(frames: list[bytes]) -> list[tuple[float, bytes]]:
    """Pair recorded frames (in arrival order, host clocks skewed) with a monotonic receive
    clock: a host's first frame arrives now, later ones as its own clock advances."""
    out, offsets, now = [], {}, None
    for data in frames:
        env = msgpack.unpackb(data, raw=False)
        ts = env["ts"]
        off = offsets.setdefault(env["host"], 0.0 if now is None else ts - now)
        now = ts - off if now is None else max(now, ts - off)
        out.append((now, data))
    return out


# ------------------------------------------------------------------------------ stages
def unpack(data: bytes) -> Any:
    mf = wire.DEFAULT_MAX_FRAME
    return msgpack.unpackb(data, raw=False, use_list=True, strict_map_key=True,
                           max_str_len=mf, max_bin_len=mf, max_array_len=mf, max_map_len=mf,
                           max_ext_len=0)


def time_each(fn: Callable[[bytes], Any], mix: Mix) -> float:
    t0 = time.process_time()
    for _, data in mix.stream:
        fn(data)
    return time.process_time() - t0


def time_ingest(ingest: Ingest, mix: Mix, batch: int = 1) -> float:
    """Feed the stream as the server does: handle each frame, tick once per simulated second;
    `batch` frames per transaction."""
    handle, tick = ingest.handle, ingest.tick
    next_tick = mix.stream[0][0] + 1.0
    rejected = 0
    t0 = time.process_time()
    for k in range(0, len(mix.stream), batch):
        with ingest.batch():
            for now, data in mix.stream[k:k + batch]:
                if now >= next_tick:
                    tick(now)
                    next_tick = now + 1.0
                rejected += handle(data, now).reject is not None
            ingest.take_acks(now)
    elapsed = time.process_time() - t0
    ingest.store.conn.close()
    if rejected:
        raise SystemExit(f"{mix.name}: {rejected} frames rejected: {ingest.stats()['rejected']}")
    return elapsed


def time_diagnosis(db: str, mix: Mix) -> float:
    """C4D alone on the decoded frames, ticked once per simulated second as ingest does."""
    diagnosis = build_core(AggregatorConfig(db=Path(db), actions={"dry_run": True}),
                           topology=mix.topology).diagnosis
    frames = [(now, fast.decode(data)) for now, data in mix.stream]
    next_tick = frames[0][0] + 1.0
    t0 = time.process_time()
    for now, frame in frames:
        if now >= next_tick:
            diagnosis.tick(now)
            next_tick = now + 1.0
        diagnosis.observe(frame, now)
    return time.process_time() - t0


def plain_ingest(db: str) -> Ingest:
    return Ingest(Store(connect(db)), HostRegistry(), None, log=logging.getLogger("bench"))


def full_ingest(db: str, topology: Any) -> Ingest:
    cfg = AggregatorConfig(db=Path(db), actions={"dry_run": True})
    return build_core(cfg, topology=topology).ingest


def stage_runs(mix: Mix, tmp: Path) -> dict[str, Callable[[], float]]:
    """Stage -> one timed run (CPU seconds); ingest runs get a fresh database each time."""
    runs = iter(range(1 << 30))

    def db() -> str:
        return str(tmp / f"{mix.name}-{next(runs)}.db")

    stages = {
        "unpack": lambda: time_each(unpack, mix),
        "decode": lambda: time_each(wire.decode, mix),
        "decode/C": lambda: time_each(fast.decode, mix),
        "ingest/mem": lambda: time_ingest(plain_ingest(":memory:"), mix),
        "ingest/wal": lambda: time_ingest(plain_ingest(db()), mix),
        "full": lambda: time_ingest(full_ingest(db(), mix.topology), mix),
        "full/batch": lambda: time_ingest(full_ingest(db(), mix.topology), mix, BATCH),
        "c4d": lambda: time_diagnosis(db(), mix),
    }
    stages["msgspec"] = lambda: time_each(msgspec.msgpack.Decoder().decode, mix)
    return stages


def measure(mix: Mix, tmp: Path, repeats: int) -> dict[str, float]:
    """Stage -> CPU seconds per frame, the best of `repeats` runs. Stages take turns, so load
    from other processes drifting over time hits them all alike."""
    stages = stage_runs(mix, tmp)
    best = dict.fromkeys(stages, float("inf"))
    for _ in range(repeats):
        for stage, run in stages.items():
            gc.collect()
            best[stage] = min(best[stage], run())
    return {stage: t / len(mix.stream) for stage, t in best.items()}


# ------------------------------------------------------------------------------ report
def print_mix(mix: Mix, per_frame: dict[str, float]) -> None:
    base = per_frame["unpack"]
    print(f"\n{mix.name}: {len(mix.stream)} frames, {mix.mean_bytes:,.0f} B/frame on average")
    print(f"  {'stage':<12}{'us/frame':>12}{'frames/s':>12}{'x unpack':>10}")
    for stage in STAGES:
        s = per_frame[stage]
        print(f"  {stage:<12}{s * 1e6:>12.1f}{1 / s:>12,.0f}{s / base:>10.2f}")
    validation = per_frame["decode"] - base
    print(f"  schema validation in Python {validation * 1e6:.0f} us "
          f"({validation / per_frame['decode']:.0%} of decode); decode/C (unpacked once and "
          f"validated in C) takes {per_frame['decode/C'] / base:.2f}x the time of "
          f"msgpack.unpackb alone, {per_frame['decode'] / per_frame['decode/C']:.1f}x less than "
          f"decode; one transaction per {BATCH} frames makes full "
          f"{per_frame['full'] / per_frame['full/batch']:.2f}x faster")
    untyped = per_frame["msgspec"]
    print(f"  msgspec.msgpack.decode (untyped): {untyped * 1e6:.1f} us/frame, "
          f"{base / untyped:.2f}x the speed of msgpack.unpackb")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true",
                    help="smaller streams (about half a minute on 2 cores)")
    ap.add_argument("--repeats", type=int, default=3, help="runs per stage, the best shown")
    ap.add_argument("--hosts", type=int, help="hosts replaying the golden recording (default "
                    "64; 16 with --quick); a quarter of them send the 1,000-flow reports")
    ap.add_argument("--sim-seconds", type=float, help="simulated seconds of the 256-host "
                    "cluster (default 20; 4 with --quick)")
    ap.add_argument("--mix", action="append", choices=("agent", "tcp1000", "tcpjob", "sim"),
                    help="run only this mix (repeatable; default all)")
    args = ap.parse_args()
    hosts = args.hosts or (16 if args.quick else 64)
    sim_seconds = args.sim_seconds or (4.0 if args.quick else 20.0)
    if args.repeats < 1 or hosts < 4 or sim_seconds < 2:
        ap.error("need --repeats >= 1, --hosts >= 4, --sim-seconds >= 2")
    logging.disable(logging.WARNING)  # diagnosis logs its incidents; numbers only here
    builders: dict[str, Callable[[Path], Mix]] = {
        "agent": lambda tmp: agent_mix(hosts, cycles=10 if args.quick else 20),
        "tcp1000": lambda tmp: tcp_mix(hosts // 4, reports=5 if args.quick else 10),
        "tcpjob": lambda tmp: tcp_job_mix(hosts // 4, reports=5 if args.quick else 10),
        "sim": lambda tmp: sim_mix(sim_seconds, tmp),
    }
    msgspec_version = msgspec.__version__ if msgspec is not None else "not installed"
    print(f"ingest: CPU time per frame, best of {args.repeats} runs per stage; python "
          f"{sys.version.split()[0]}, msgpack {'.'.join(map(str, msgpack.version))}, "
          f"msgspec {msgspec_version}")
    with tempfile.TemporaryDirectory(prefix="c4-bench-ingest-") as tmp:
        for name in args.mix or builders:
            mix = builders[name](Path(tmp))
            print_mix(mix, measure(mix, Path(tmp), args.repeats))


if __name__ == "__main__":
    main()

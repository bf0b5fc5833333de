"""`bench/load --hosts N`: N simulated hosts at 1 report/s against a real aggregator over CURVE,
ramped in steps to find the ceiling (the hosts at which the ack latency p99 passes 1 s), for
the ingest path as it is and, in the same run, as it was before issue 15 (the Python schema
validator on every body, one SQLite commit per frame).

The mix (issue 15): every host reports NCCL summaries of its 8 GPUs, the counters of its 8 RDMA
NICs, its host load and a kmsg section; every TCP_EVERY-th host also 200 TCP flows. Hosts come
in jobs of GROUP hosts: each job replays a `c4 sim` run of a 32-host, 256-GPU leaf-spine cluster
under its own communicator hash and job id, so diagnosis sees 391 independent jobs at 12,512
hosts. Job 0 replays a run with a NIC slowed FAULT_AT simulated seconds in: C4D must name it.

The load generator shares the 2 cores with the aggregator, so it does as little as it can: the
bodies are made and msgpack-encoded before the run; sending a frame is a few byte
concatenations (envelope, a same-length replace of the job's hash and id) and one send() on the
host's own CURVE DEALER socket (one enrolled key and one connection per host). A process cannot
hold 12,500 ZeroMQ sockets under a 20,000 open-file limit (a connection and an eventfd each), so
the hosts are split over as few forked processes as the limit allows (2 at 12,512). Each step's
new hosts connect and finish their CURVE handshake (counted by the ZAP handler) before the step
starts. Ack latency is measured on a sample of the hosts (every SAMPLE_EVERY-th), whose sockets
are read as soon as their acks can be there; the others' acks are drained once a second. The
generators' own CPU (their threads and ZeroMQ's I/O threads, CURVE included) is printed beside
the aggregator's, so the two can be told apart: on 2 cores, what the generators use is not
available to the aggregator.

CPU per frame by stage is measured in this process on the same frames (best of 3, 1 with
--quick): decode with the DSL validator, decode in C, storing per frame and in batches,
diagnosis, and the full path as before issue 15. The aggregator's live CPU per frame (from /proc)
minus that is what ZeroMQ, CURVE, the server loop and the diagnosis ticks (whose cost grows
with the cluster, while the offline sample has 2 jobs) add.
"""
from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import msgpack
import psutil
import zmq

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from c4.aggregator.ingest import Ingest  # noqa: E402
from c4.aggregator.server import build_core  # noqa: E402
from c4.aggregator.config import AggregatorConfig  # noqa: E402
from c4.aggregator.state import HostRegistry  # noqa: E402
from c4.aggregator.store import Store, connect  # noqa: E402
from c4.core import keys, record, wire  # noqa: E402
from c4.core.keys import ClientKeys  # noqa: E402
from c4.core.wire import fast  # noqa: E402
from c4.lab.sim import Fault, SimConfig, simulate  # noqa: E402

GROUP = 32  # hosts per job (one c4 sim cluster: 32 hosts x 8 GPUs, 4 leaves, 2 spines)
SIM_SHAPE = {"hosts": GROUP, "gpus_per_host": 8, "leaves": 4, "spines": 2}
TCP_EVERY, TCP_FLOWS = 10, 200
SAMPLE_EVERY = 8
OFFSET = [(i * 0.6180339887498949) % 1.0 for i in range(1 << 16)]  # host -> offset in its second
FAULT_AT, FAULT = 6.0, ("slow-node", 5, "mlx5_3")  # job 0: host 5's NIC mlx5_3 slowed 3x
P99_LIMIT = 1.0
# The aggregator as it was before issue 15, for the same-run ratio: every body through the DSL
# validator and one transaction per frame. Everything else (reliability, identity) is today's.
BEFORE = ("import contextlib, sys\n"
          "from c4.core import wire\n"
          "from c4.core.wire import fast\n"
          "import c4.aggregator.ingest as ingest\n"
          "fast.decode = wire.decode\n"
          "ingest.Ingest.batch = lambda self: contextlib.nullcontext()\n"
          "from c4.cli import main\n"
          "sys.exit(main(sys.argv[1:]))\n")


# ------------------------------------------------------------------------------ frames
def _pairs(d: dict[str, Any]) -> tuple[int, bytes]:
    """A map as (entries, encoded key/value pairs without the header): more can be appended."""
    return len(d), b"".join(msgpack.packb(k) + msgpack.packb(v, use_bin_type=True)
                            for k, v in d.items())


def _map(n: int, pairs: bytes) -> bytes:
    return (bytes([0x80 | n]) if n < 16 else b"\xde" + n.to_bytes(2, "big")) + pairs


def tcp_section(rng: random.Random, host: int) -> dict[str, Any]:
    flows = []
    for i in range(TCP_FLOWS):
        d = rng.randrange(1 << 24)
        flows.append({
            "saddr": f"10.1.{host}.1", "daddr": f"10.2.{i >> 8}.{i & 255}", "sport": 40000 + i,
            "dport": 29500, "family": "ipv4", "netns": 4026531840, "pid": 20000 + i % 8,
            "comm": "pt_main_thread", "state": "ESTABLISHED", "bytes_acked": d * 64,
            "bytes_received": d * 60, "retrans_segs": i % 3, "bytes_acked_delta": d,
            "bytes_received_delta": d, "retrans_segs_delta": 0, "bytes_acked_rate": float(d),
            "bytes_received_rate": float(d), "srtt_us": 80 + i % 50, "cwnd": 10 + i % 90,
            "closed": False})
    return {"flows": flows, "omitted": 0, "tracked": TCP_FLOWS, "map_full": 0,
            "drops": {"NOT_SPECIFIED": 3}, "drops_delta": {}}


@dataclass
class Job:
    """One sim run as templates: per host position, hello body and per-second frames."""

    comm_hashes: list[bytes]
    job_ids: list[bytes]
    hello: list[bytes] = field(default_factory=list)
    seconds: list[list[list[tuple[str, int, bytes]]]] = field(default_factory=list)  # [pos][s]


def make_job(seconds: float, tmp: Path, faults: list[Fault]) -> Job:
    out = tmp / f"job{len(faults)}.c4rec"
    # no clock skew (the frames are re-timed as they are sent), every rank busy from the start
    simulate(SimConfig(**SIM_SHAPE, duration=seconds, seed=7, faults=faults, max_skew=0.0,
                       late_join=0.0), out)
    frames = [wire.decode(d) for d in record.read(out)]
    hosts = sorted({f.host for f in frames})
    t0 = min(f.ts for f in frames if f.kind == "report")
    comms = sorted({c["comm"] for f in frames if f.kind == "report"
                    for c in f.body.get("nccl", {}).get("comms", [])})
    jobs = sorted({c["job"] for f in frames if f.kind == "report"
                   for c in f.body.get("nccl", {}).get("comms", []) if c.get("job")})
    job = Job([c.encode() for c in comms], [j.encode() for j in jobs])
    n = int(seconds)
    job.seconds = [[[] for _ in range(n)] for _ in hosts]
    job.hello = [b""] * len(hosts)
    kmsg = [0] * len(hosts)
    for f in frames:
        p = hosts.index(f.host)
        if f.kind == "hello":
            job.hello[p] = msgpack.packb(f.body, use_bin_type=True)
            continue
        s = int(f.ts - t0)
        if not 0 <= s < n:
            continue
        body = dict(f.body)
        if f.kind == "report":
            kmsg[p] += 40
            body["kmsg"] = {"records": kmsg[p], "events": 0, "ignored": kmsg[p], "malformed": 0,
                            "overwritten": 0}
        entries, pairs = _pairs(body)
        job.seconds[p][s].append((f.kind, entries, pairs))
    return job


def job_bytes(job: Job, g: int) -> list[tuple[bytes, bytes]]:
    """(template, replacement) pairs that make job `g` of a template: its own comm hashes and
    job ids, of the same length so the msgpack around them stays valid."""
    subs = [(c, f"{(int(c, 16) ^ (g * 0x9E3779B97F4A7C15)) & (2**64 - 1):016x}".encode())
            for c in job.comm_hashes]
    subs += [(j, (f"j{g:0{len(j) - 1}d}").encode()[-len(j):]) for j in job.job_ids]
    return subs


class Hosts:
    """Every simulated host's sequence and frame templates; sockets for the hosts this process
    sends for (`connect`)."""

    def __init__(self, n_groups: int, clean: Job, faulty: Job) -> None:
        self.n = n_groups * GROUP
        self.names = host_names(n_groups)
        self.seq = [0] * self.n
        self.heads = [msgpack.packb("host") + msgpack.packb(h) + msgpack.packb("boot")
                      + msgpack.packb(os.urandom(8).hex()) for h in self.names]
        self.jobs = [faulty if g == 0 else clean for g in range(n_groups)]
        self.subs = [job_bytes(self.jobs[g], g) for g in range(n_groups)]
        rng = random.Random(3)
        self.tcp = [_pairs({"tcp_flows": tcp_section(rng, p)}) for p in range(GROUP)]
        self.socks: dict[int, zmq.Socket[bytes]] = {}

    def connect(self, hosts: list[int], endpoint: str, server_public: bytes,
                pairs: list[tuple[bytes, bytes]]) -> None:
        if not self.socks:
            self.ctx = zmq.Context(io_threads=1)
            self.ctx.set(zmq.MAX_SOCKETS, 65536)
        for i in hosts:
            s: zmq.Socket[bytes] = self.ctx.socket(zmq.DEALER)
            s.setsockopt(zmq.LINGER, 0)
            ClientKeys(server_public, *pairs[i]).apply(s)
            s.connect(endpoint)
            self.socks[i] = s

    def frame(self, i: int, kind: str, entries: int, pairs: bytes) -> bytes:
        g, p = divmod(i, GROUP)
        if kind == "report" and i % TCP_EVERY == 0:
            entries, pairs = entries + 1, pairs + self.tcp[p][1]
        body = _map(entries, pairs)
        for old, new in self.subs[g]:
            body = body.replace(old, new)
        self.seq[i] += 1
        return (b"\x87\xa1v\x92\x01\x00\xa4kind" + msgpack.packb(kind) + self.heads[i]
                + b"\xa3seq" + msgpack.packb(self.seq[i]) + b"\xa2ts" + msgpack.packb(time.time())
                + b"\xa4body" + body)

    def hello(self, i: int) -> bytes:
        g, p = divmod(i, GROUP)
        body = msgpack.unpackb(self.jobs[g].hello[p])
        return self.frame(i, "hello", *_pairs(body))

    def close(self) -> None:
        for s in self.socks.values():
            s.close(0)
        if self.socks:
            self.ctx.term()


def host_names(n_groups: int) -> list[str]:
    return [f"g{i // GROUP:04d}n{i % GROUP:02d}" for i in range(n_groups * GROUP)]


# ------------------------------------------------------------------------------ aggregator
class Aggregator:
    def __init__(self, tmp: Path, names: list[str], before: bool) -> None:
        kd = tmp / "keys"
        keys.create_pair(kd, keys.SERVER_NAME)
        self.server_public = keys.load_public(kd / f"{keys.SERVER_NAME}{keys.PUBLIC_SUFFIX}")
        self.pairs = [zmq.curve_keypair() for _ in names]
        (kd / "enrolled").write_text(keys.STORE_HEADER + "".join(
            f"{h} {pub.decode()}\n" for h, (pub, _) in zip(names, self.pairs)))
        import socket
        ports = []
        for _ in range(2):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                ports.append(s.getsockname()[1])
        self.endpoint, self.url = f"tcp://127.0.0.1:{ports[0]}", f"http://127.0.0.1:{ports[1]}"
        cfg = tmp / "aggregator.toml"
        cfg.write_text(f'listen = "{self.endpoint}"\napi = "127.0.0.1:{ports[1]}"\n'
                       f'db = "{tmp}/c4.db"\nserver_secret_key = "{kd}/server.key_secret"\n'
                       f'enrolled_keys = "{kd}/enrolled"\n[actions]\ndry_run = true\n')
        self.log = open(tmp / "aggregator.log", "wb")
        argv = ["aggregator", "run", "--config", str(cfg)]
        cmd = [sys.executable, "-c", BEFORE, *argv] if before else [
            sys.executable, "-m", "c4.cli", *argv]
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT)
        self.ps = psutil.Process(self.proc.pid)
        deadline = time.monotonic() + 60
        while True:
            try:
                self.api("/healthz")
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(f"aggregator did not start; see {tmp}/aggregator.log") from None
                time.sleep(0.2)

    def api(self, path: str) -> Any:
        import urllib.request
        with urllib.request.urlopen(self.url + path, timeout=30) as r:
            return json.loads(r.read())

    def cpu_s(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system

    def rss(self) -> int:
        return self.ps.memory_info().rss

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def _own_cpu() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


# ------------------------------------------------------------------------------ the ramp
@dataclass
class Step:
    hosts: int
    seconds: float
    frames: int = 0
    accepted: int = 0
    latencies: list[float] = field(default_factory=list)
    agg_cpu: float = 0.0  # share of one core
    gen_cpu: float = 0.0
    rss: int = 0

    def p(self, q: float) -> float:
        xs = sorted(self.latencies)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("inf")


class Sender:
    """The hosts `owned` by one load-generator process: hellos, reports at 1 Hz on a shared
    schedule, acks read (and timed on the sampled hosts)."""

    def __init__(self, hosts: Hosts, owned: range) -> None:
        self.h, self.owned = hosts, owned
        self.active: list[int] = []
        self.pending: dict[int, list[tuple[int, float]]] = {}  # sampled host -> (seq, sent)

    def _read(self, i: int, latencies: list[float] | None) -> None:
        s = self.h.socks[i]
        while True:
            try:
                data = s.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            if latencies is None:
                continue
            msg = msgpack.unpackb(data)
            if msg.get("kind") != "ack":
                continue
            acked, now, q = msg["body"]["seq"], time.monotonic(), self.pending.get(i)
            while q and q[0][0] <= acked:
                latencies.append(now - q.pop(0)[1])
            if not q:
                self.pending.pop(i, None)

    def step(self, hosts_n: int, seconds: float, base: float, started: list[float]
             ) -> dict[str, Any]:
        """Hosts below hosts_n say hello now (the new ones) and report at 1 Hz, each at its own
        offset within the second (golden-ratio spaced: any number of active hosts is spread
        evenly), from the next second on, for `seconds`."""
        h = self.h
        frames, latencies = 0, []
        gen0, t0 = _own_cpu(), time.monotonic()
        new = [i for i in self.owned if i < hosts_n][len(self.active):]
        for i in new:
            h.socks[i].send(h.hello(i), zmq.NOBLOCK)
            frames += 1
        self.active += new
        order = sorted(self.active, key=OFFSET.__getitem__)
        offsets = [OFFSET[i] for i in order] + [2.0]  # a sentinel: never due within its second
        second = base + int(t0 - base) + 1.0
        k = 0
        next_drain, end, sweep = t0 + 1.0, t0 + seconds, 0.0
        while (now := time.monotonic()) < end:
            while second + offsets[k] <= now:
                i = order[k]
                g, p = divmod(i, GROUP)
                ticks = h.jobs[g].seconds[p]
                sec = min(int(time.time() - started[g]), len(ticks) - 1)
                for kind, entries, pairs in ticks[sec]:
                    h.socks[i].send(h.frame(i, kind, entries, pairs), zmq.NOBLOCK)
                    frames += 1
                    if i % SAMPLE_EVERY == 0:
                        self.pending.setdefault(i, []).append((h.seq[i], time.monotonic()))
                k += 1
            if k == len(order) and now >= second + 1.0:
                k, second = 0, second + 1.0
            if now >= sweep:  # sampled hosts with frames in flight: read their acks
                for i in list(self.pending):
                    self._read(i, latencies)
                # bounded: reading every pending socket costs ~2 us each
                sweep = time.monotonic() + max(0.002, len(self.pending) * 20e-6)
            if now >= next_drain:  # the others' acks, unmeasured, so they do not pile up
                for i in self.active:
                    if i % SAMPLE_EVERY:
                        self._read(i, None)
                next_drain = now + 1.0
            time.sleep(max(0.0, min(second + min(offsets[k], 1.0), sweep, end)
                               - time.monotonic()))
        return {"frames": frames, "latencies": latencies,
                "gen_cpu": (_own_cpu() - gen0) / (time.monotonic() - t0)}

    def settle(self, seconds: float) -> list[float]:
        latencies: list[float] = []
        deadline = time.monotonic() + seconds
        while self.pending and time.monotonic() < deadline:
            for i in list(self.pending):
                self._read(i, latencies)
            time.sleep(0.01)
        return latencies


def _sender_main(conn: Any, hosts: Hosts, owned: range, endpoint: str, server_public: bytes,
                 pairs: list[tuple[bytes, bytes]]) -> None:
    """A load-generator process: commands from the parent over `conn`, results back."""
    sender = Sender(hosts, owned)
    try:
        while True:
            cmd, *a = conn.recv()
            if cmd == "connect":  # the hosts of the next step, before it starts
                hosts.connect([i for i in owned if i < a[0] and i not in hosts.socks],
                              endpoint, server_public, pairs)
                conn.send(None)
            elif cmd == "step":
                conn.send(sender.step(*a))
            elif cmd == "settle":
                conn.send(sender.settle(*a))
            elif cmd == "sent":
                conn.send(sum(hosts.seq[i] for i in owned))
            else:
                break
    finally:
        hosts.close()


class Ramp:
    """The load generator: the hosts split over processes (one process cannot hold 12,500
    ZeroMQ sockets under a 20,000 open-file limit), driven step by step from here."""

    def __init__(self, hosts: Hosts, agg: Aggregator, procs: int) -> None:
        import multiprocessing as mp

        self.agg, self.n = agg, hosts.n
        ctx = mp.get_context("fork")  # the templates are shared, not copied, until written
        self.conns, self.procs = [], []
        for c in range(procs):
            parent, child = ctx.Pipe()
            owned = range(c, hosts.n, procs)  # interleaved: every step loads each alike
            p = ctx.Process(target=_sender_main, args=(child, hosts, owned, agg.endpoint,
                                                       agg.server_public, agg.pairs))
            p.start()
            self.conns.append(parent)
            self.procs.append(psutil.Process(p.pid))
        self.active = 0
        self.connect_cpu = 0.0  # aggregator CPU spent admitting connections (not frames)
        self.started: list[float] = []  # per group: when its hosts said hello
        self.base = 0.0  # second boundaries of the shared schedule (monotonic clock)
        self.fault_wall = 0.0

    def connect(self, hosts_n: int, limit: float) -> float:
        """Connect the hosts below hosts_n, and wait until the ZAP handler has admitted every
        one (CURVE handshakes done): seconds it took."""
        t0, cpu0 = time.monotonic(), self.agg.cpu_s()
        for conn in self.conns:
            conn.send(("connect", hosts_n))
        for conn in self.conns:
            conn.recv()
        while time.monotonic() - t0 < limit:
            if self.agg.api("/api/v1/stats")["auth"]["allowed"] >= hosts_n:
                break
            time.sleep(0.2)
        self.connect_cpu += self.agg.cpu_s() - cpu0
        return time.monotonic() - t0

    def run_step(self, step: Step) -> None:
        st0 = sum(self.agg.api("/api/v1/stats")["accepted"].values())
        cpu0, t0 = self.agg.cpu_s(), time.monotonic()
        if not self.started:
            self.base = t0
        for g in range(self.active // GROUP, step.hosts // GROUP):
            self.started.append(time.time())
            if g == 0:
                self.fault_wall = time.time() + FAULT_AT
        self.active = step.hosts
        for conn in self.conns:
            conn.send(("step", step.hosts, step.seconds, self.base, self.started))
        for conn in self.conns:
            r = conn.recv()
            step.frames += r["frames"]
            step.latencies += r["latencies"]
            step.gen_cpu += r["gen_cpu"]
        took = time.monotonic() - t0
        step.agg_cpu = (self.agg.cpu_s() - cpu0) / took
        step.rss = self.agg.rss()
        step.accepted = sum(self.agg.api("/api/v1/stats")["accepted"].values()) - st0

    def settle(self, latencies: list[float], seconds: float) -> None:
        for conn in self.conns:
            conn.send(("settle", seconds))
        for conn in self.conns:
            latencies += conn.recv()

    def sent(self) -> int:
        for conn in self.conns:
            conn.send(("sent",))
        return sum(conn.recv() for conn in self.conns)

    def close(self) -> None:
        for conn in self.conns:
            conn.send(("close",))
        for p in self.procs:
            try:
                p.wait(30)
            except psutil.TimeoutExpired:
                p.kill()


# ------------------------------------------------------------------------------ stage costs
def stage_costs(hosts: Hosts, seconds: int, tmp: Path, repeats: int) -> dict[str, float]:
    """µs of CPU per frame, by stage, on frames of this mix (2 jobs, `seconds` each), the
    best of `repeats` runs."""
    frames = []
    for g in (0, 1):
        for p in range(GROUP):
            i = g * GROUP + p
            frames.append((0.0, hosts.hello(i)))
            for s in range(seconds):
                for kind, entries, pairs in hosts.jobs[g].seconds[p][s]:
                    frames.append((float(s + 1), hosts.frame(i, kind, entries, pairs)))
    frames.sort(key=lambda x: x[0])
    data = [d for _, d in frames]

    def each(fn: Callable[[bytes], Any]) -> float:
        t = time.process_time()
        for d in data:
            fn(d)
        return time.process_time() - t

    def ingest(ing: Ingest, batch: bool) -> float:
        t, nxt = time.process_time(), 1.0
        for k in range(0, len(frames), 512):
            with ing.batch() if batch else contextlib.nullcontext():
                for now, d in frames[k:k + 512]:
                    if now >= nxt:
                        ing.tick(now)
                        nxt = now + 1
                    ing.handle(d, now)
                ing.take_acks(now)
        t = time.process_time() - t
        ing.store.conn.close()
        return t

    runs = iter(range(1000))

    def plain(batch: bool) -> float:
        return ingest(Ingest(Store(connect(tmp / f"s{next(runs)}.db")), HostRegistry(), None),
                      batch)

    def full(batch: bool) -> float:
        cfg = AggregatorConfig(db=tmp / f"f{next(runs)}.db", actions={"dry_run": True})
        return ingest(build_core(cfg).ingest, batch)

    stages = {
        "unpack": lambda: each(lambda d: msgpack.unpackb(d)),
        "decode, DSL": lambda: each(wire.decode),
        "decode, C": lambda: each(fast.decode),
        "+ store, per frame": lambda: plain(False),
        "+ store, batched": lambda: plain(True),
        "+ diagnosis, batched": lambda: full(True),
        "before issue 15": lambda: _before(full),
    }
    best = dict.fromkeys(stages, float("inf"))
    for _ in range(repeats):
        for k, fn in stages.items():
            gc.collect()
            best[k] = min(best[k], fn())
    return {k: v / len(data) * 1e6 for k, v in best.items()}


def _before(full: Callable[[bool], float]) -> float:
    decode = fast.decode
    fast.decode = wire.decode
    try:
        return full(False)
    finally:
        fast.decode = decode


# ------------------------------------------------------------------------------ main
def run(args: Any) -> int:
    logging.disable(logging.WARNING)
    groups = -(-args.hosts // GROUP)
    import resource

    # Each host is a ZeroMQ socket in a generator (a connection and an eventfd) and a
    # connection in the aggregator: split the hosts so each process stays under its limit.
    limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    procs = max(1, -(-2 * groups * GROUP // (limit - 1024)))
    if groups * GROUP + 1024 > limit:
        raise SystemExit(f"--hosts needs {groups * GROUP + 1024} open files in the aggregator, "
                         f"the limit is {limit} (ulimit -n)")
    step_s = args.step_seconds
    steps_new = [g * GROUP for g in _steps(groups, args.steps)]
    sim_s = float(int(step_s * (len(steps_new) + 1) + 4))
    print(f"{groups * GROUP} hosts in {groups} jobs of {GROUP} (8 GPUs, 8 NICs each); every "
          f"{TCP_EVERY}th host also {TCP_FLOWS} TCP flows; CURVE on; {os.cpu_count()} CPUs, load "
          f"average {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory(prefix="c4-load-hosts-") as tmpdir:
        tmp = Path(tmpdir)
        t = time.monotonic()
        clean = make_job(sim_s, tmp, [])
        faulty = make_job(sim_s, tmp, [Fault(FAULT[0], f"node{FAULT[1]:03d}/{FAULT[2]}",
                                             FAULT_AT)])
        print(f"frames made in {time.monotonic() - t:.1f} s (2 c4 sim runs of {GROUP} hosts x "
              f"{sim_s:.0f} s, encoded once)")
        results = {}
        for label, before in (("after", False), ("before", True)):
            d = tmp / label
            d.mkdir()
            agg = Aggregator(d, host_names(groups), before)
            ramp = None
            try:
                ramp = Ramp(Hosts(groups, clean, faulty), agg, procs)
                cpu_start = agg.cpu_s()
                print(f"\n{label} issue 15 ({procs} load-generator processes; each step's new "
                      "hosts connect and finish their CURVE handshake before it starts):")
                print(f"  {'hosts':>7} {'connect s':>9} {'frames/s':>9} {'stored/s':>9} "
                      f"{'ack p50 ms':>11} {'p99 ms':>9} {'agg CPU':>8} {'gen CPU':>8} "
                      f"{'agg RSS':>8}")
                steps = []
                for hosts_n in steps_new:
                    took = ramp.connect(hosts_n, 120)
                    st = Step(hosts_n, step_s)
                    ramp.run_step(st)
                    steps.append(st)
                    print(f"  {st.hosts:>7,} {took:>9.1f} {st.frames / st.seconds:>9,.0f} "
                          f"{st.accepted / st.seconds:>9,.0f} {st.p(.5) * 1e3:>11.1f} "
                          f"{st.p(.99) * 1e3:>9.1f} {st.agg_cpu:>7.0%} {st.gen_cpu:>7.0%} "
                          f"{st.rss / 2**20:>6.0f} M")
                    if st.p(.99) > P99_LIMIT:
                        break
                ramp.settle(steps[-1].latencies, 5)
                sent = ramp.sent()
                # a backlog is drained, not dropped: wait for it, a while
                deadline = time.monotonic() + 2 * step_s
                while True:
                    stats = agg.api("/api/v1/stats")
                    done = sum(stats["accepted"].values()) + sum(stats["rejected"].values())
                    if done >= sent or time.monotonic() > deadline:
                        break
                    time.sleep(1.0)
                stats["cpu_s"] = agg.cpu_s() - cpu_start - ramp.connect_cpu
                incidents = agg.api("/api/v1/incidents")["incidents"]
                results[label] = (steps, stats, incidents, ramp)
                _summary(steps, stats, incidents, ramp.fault_wall, sent)
            finally:
                if ramp is not None:
                    ramp.close()
                agg.stop()
        stages = stage_costs(Hosts(2, clean, faulty), min(int(sim_s), 10), tmp,
                             1 if args.quick else 3)
    _report(results, stages)
    return 0


def _steps(groups: int, n: int) -> list[int]:
    return sorted({max(1, round(groups * (k + 1) / n)) for k in range(n)})


def _ceiling(steps: list[Step]) -> str:
    ok = [s.hosts for s in steps if s.p(.99) <= P99_LIMIT]
    bad = [s.hosts for s in steps if s.p(.99) > P99_LIMIT]
    if not bad:
        return f">= {max(ok):,} (p99 stayed under 1 s at every step)"
    return f"{max(ok, default=0):,}-{min(bad):,}"


def _summary(steps: list[Step], stats: dict[str, Any], incidents: list[dict[str, Any]],
             fault_wall: float, sent: int) -> None:
    stored = sum(stats["accepted"].values())
    queued = sent - stored - sum(stats["rejected"].values())
    print(f"  ceiling (hosts at which ack p99 passes {P99_LIMIT:.0f} s): {_ceiling(steps)}")
    print(f"  frames sent {sent:,}, stored {stored:,}"
          + (f" ({queued:,} still queued at the end of the drain wait: not dropped, the "
             "aggregator is behind)" if queued else " (all)")
          + f", rejected {sum(stats['rejected'].values())}, duplicates "
          f"{stats['duplicates']}, store errors {stats['store_errors']}; aggregator CPU "
          f"{stats['cpu_s'] / max(stored, 1) * 1e6:.0f} µs per stored frame over the run, so one "
          f"core to itself would take {stored / stats['cpu_s']:,.0f} frames/s")
    host, nic = f"g0000n{FAULT[1]:02d}", FAULT[2]
    hit = [i for i in incidents if host in json.dumps(i["suspects"]) and
           nic in json.dumps(i["suspects"])]
    others = [i for i in incidents if i not in hit]
    if hit:
        i = hit[0]
        when = (i["localised"] or i["detected"]) - fault_wall
        print(f"  injected fault (job 0, {host} {nic} slowed 3x): incident {i['class']} naming "
              f"it {when:.1f} s after the fault (target 30 s)")
    else:
        print(f"  injected fault (job 0, {host} {nic} slowed 3x): not named "
              f"({len(incidents)} incidents)")
    print(f"  other incidents: {len(others)}"
          + (": " + ", ".join(sorted({i['class'] for i in others})) if others else ""))


def _report(results: dict[str, Any], stages: dict[str, float]) -> None:
    print(f"\nCPU per frame by stage, in this process on the same frames (µs; load average "
          f"{os.getloadavg()[0]:.2f}):")
    dsl, c = stages["decode, DSL"], stages["decode, C"]
    print(f"  unpack {stages['unpack']:.0f}; decode with the DSL validator {dsl:.0f}, in C "
          f"{c:.0f} ({dsl / c:.1f}x)")
    print(f"  decode in C + store: one commit per frame {stages['+ store, per frame']:.0f}, "
          f"batched {stages['+ store, batched']:.0f}")
    print(f"  + diagnosis (full path, batched) {stages['+ diagnosis, batched']:.0f}; the full "
          f"path before issue 15 {stages['before issue 15']:.0f} "
          f"({stages['before issue 15'] / stages['+ diagnosis, batched']:.1f}x)")
    if set(results) == {"after", "before"}:
        a, b = results["after"][0], results["before"][0]
        best = lambda ss: max((s.hosts for s in ss if s.p(.99) <= P99_LIMIT), default=0)  # noqa: E731
        ratio = best(a) / best(b) if best(b) else float("inf")
        print(f"\nceiling after / before issue 15 (same run, last step under 1 s): "
              f"{best(a):,} / {best(b):,} hosts = {ratio:.1f}x")
        for label, (steps, *_rest) in results.items():
            live = [s for s in steps if s.accepted]
            if live:
                s = max(live, key=lambda s: s.accepted)
                print(f"  {label}: live aggregator CPU {s.agg_cpu / (s.accepted / s.seconds) * 1e6:.0f}"
                      f" µs per stored frame at {s.hosts:,} hosts (ZeroMQ, CURVE and the loop "
                      f"included); load generator {s.gen_cpu / (s.frames / s.seconds) * 1e6:.0f} "
                      f"µs per frame sent")

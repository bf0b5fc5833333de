"""`c4 sim`: a deterministic cluster simulator that writes what c4 agents would send.

It models leaf-spine hosts running NCCL-like jobs (ring or double-binary-tree collectives,
one NIC per GPU) at the granularity of report intervals, and writes:
- `<out>`: a recording (c4/core/record.py) of wire frames, hello first per host, then one report
  per host per interval (all its ranks' `nccl` comm summaries plus `rdma` port counters and a
  `host` section), plus events (kmsg `xid`/`nic_link`/`pcie_aer`, rdma `port_state`/
  `link_flap`, pfc `pause_storm`, nccl `nccl_stall`), in arrival order;
- `<out>.truth.json`: the injected faults with the incident class and suspect C4D should
  name, each host's clock skew, and the clean-run events (restarts, blips) for the bench;
- `<out>.topology.json`: the topology with the learned paths of every connection.

Each host's clock is offset by a random skew of up to `max_skew` seconds and its reports have
their own phase: C4D must never compare timestamps across hosts. The model is coarse on
purpose (2,048 ranks for minutes of simulated time generate in seconds) but keeps the causal
structure C4D reads: only the slow hop shows network wait per byte, victims wait on credit;
a late rank's peers wait at entry; a rank that stops calling collectives stays behind while
the others sit in-flight; a dead NIC stops exactly its connections.
"""
from __future__ import annotations

import bisect
import json
import math
import random
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from c4.agent.collectors.base import Event
from c4.core import ordinals, record
from c4.core.catalog import ROCE_SIGNALS
from c4.core.topology import Topology, endpoint, pair_id
from c4.core.wire import Frame, encode


class SimError(ValueError):
    """A bad simulation parameter or fault spec; the message says which."""


# kind -> (incident class C4D should raise, target syntax)
FAULT_KINDS: dict[str, tuple[str, str]] = {
    "slow-node": ("comm_slow", "HOST or HOST/DEV (one NIC)"),
    "slow-link": ("comm_slow", "HOST,HOST (the path between two hosts)"),
    "lossy-link": ("comm_slow", "LEAF-SPINE (a fabric link id)"),
    "slow-fabric": ("comm_slow", "LEAF-SPINE (a fabric link slowed by x=, in dir=, no loss)"),
    "hang": ("noncomm_hang", "RANK (stops calling collectives)"),
    "sigstop": ("noncomm_hang", "RANK (stopped inside a collective: its plugin falls silent, "
                "the agent repeats its last summary, then drops it)"),
    "kernel-hang": ("noncomm_hang", "RANK (stuck in a GPU kernel inside a collective, its "
                    "plugin still reporting)"),
    "nic-down": ("hw_nic_down", "HOST/DEV"),
    "straggler": ("noncomm_slow", "RANK (arrives late at every collective)"),
    "xid": ("hw_xid", "RANK (Xid 79 on its GPU, then the rank hangs)"),
    "link-flap": ("hw_link_flap", "HOST/DEV"),
    "pfc-storm": ("hw_pfc_storm", "HOST/DEV"),
    "aer": ("hw_aer", "HOST/DEV (uncorrected AER on that NIC)"),
    "host-down": ("host_silent", "HOST (agent and ranks stop)"),
}
EPOCH = 1.7e9  # simulated time 0 as a wall clock (frames carry epoch seconds)
RANK_KINDS = ("hang", "straggler", "xid", "sigstop", "kernel-hang")
INSIDE_KINDS = ("nic-down", "sigstop", "kernel-hang")  # every rank enters the stuck op
AGENT_REPEATS = 5  # the agent repeats a silent process's last summary this many intervals
TRANSPORTS = ("nccl", "tcp")
# what a TCP-only job can show; a hang there is a stopped process (the lab's SIGSTOP): its
# state is `T` in the agent's owners, its peers' windows to it close, every flow goes idle
TCP_KINDS = ("slow-node", "slow-link", "lossy-link", "slow-fabric", "hang", "sigstop")
TCP_PORT = 29500  # the job's listening port (the rendezvous side of each connection)
BOOT_PORT = 29600  # an NCCL job's bootstrap ring listens here (its store on TCP_PORT)
TCP_GOODPUT = 1.2e9  # bytes/s per connection at nominal speed
# What a rank's process does, as its agent's owners counters show it (CPU seconds per second,
# bytes written per second): training (its main thread and NCCL's proxy), a checkpoint writer
# (serialises and writes), a hung rank blocked (housekeeping threads only) or spinning (a busy
# loop, a CUDA sync spin-wait: SPIN_SHARE of `hang` faults, named only after the allowance)
CPU_TRAIN = (1.0, 1.5)
CPU_WRITE, WRITE_BPS = (0.3, 1.0), (0.2e9, 2e9)
CPU_BLOCKED = (0.002, 0.02)
CPU_SPIN = (0.9, 1.0)
SPIN_SHARE = 0.2
TCP_SRTT_US = 40.0
# retransmitted segments per MB on a clean connection, and the factor a fault multiplies it by
TCP_LOSS_PER_MB = 0.01
TCP_LOSS = {"slow-link": 300.0, "slow-node": 1.0}
HANG_KINDS = ("hang", "xid", "nic-down", "host-down", "sigstop", "kernel-hang")
# The port counters the simulator advances: traffic, the RoCE symptom counters, link downs.
COUNTERS = ("port_xmit_data", "port_rcv_data", *ROCE_SIGNALS, "link_downed")


@dataclass
class Fault:
    kind: str
    target: str
    start: float
    end: float | None = None
    params: dict[str, str] = field(default_factory=dict)

    @classmethod
    def parse(cls, spec: str) -> "Fault":
        """KIND:TARGET@START[-END][;KEY=VALUE...], e.g. `slow-link:node001,node002@30-90`,
        `lossy-link:leaf01-spine00@20;loss=0.002;dir=up`, `slow-node:node003/mlx5_1@9;x=1.11`
        (keys: `x` slowdown factor, `loss` packet loss rate, `dir` up | down | both, `ahead`
        0 | 1 for sigstop: whether the culprit's ring successor finished the op, see
        Simulator._freeze)."""
        spec, *opts = spec.split(";")
        params = {}
        for o in opts:
            k, eq, v = o.partition("=")
            if not eq or k not in ("x", "loss", "dir", "ahead"):
                raise SimError(f"fault option {o!r}: expected x=, loss=, dir= or ahead=")
            params[k] = v
        if params.get("ahead", "0") not in ("0", "1"):
            raise SimError(f"fault option ahead={params['ahead']}: expected 0 or 1")
        if params.get("dir", "both") not in ("up", "down", "both"):
            raise SimError(f"fault option dir={params['dir']}: expected up, down or both")
        try:
            float(params.get("x", 1)), float(params.get("loss", 0))
        except ValueError:
            raise SimError(f"fault {spec!r}: x and loss must be numbers") from None
        head, at, when = spec.partition("@")
        kind, colon, target = head.partition(":")
        if not colon or not at or not target:
            raise SimError(f"fault {spec!r}: expected KIND:TARGET@START[-END]")
        if kind not in FAULT_KINDS:
            raise SimError(f"fault {spec!r}: unknown kind {kind!r}; known: {', '.join(FAULT_KINDS)}")
        start_s, dash, end_s = when.partition("-")
        try:
            start = float(start_s)
            end = float(end_s) if dash else None
        except ValueError:
            raise SimError(f"fault {spec!r}: START and END must be seconds") from None
        if start < 0 or (end is not None and end <= start):
            raise SimError(f"fault {spec!r}: need 0 <= START < END")
        return cls(kind, target, start, end, params)

    def active(self, t: float) -> bool:
        return self.start <= t and (self.end is None or t < self.end)


@dataclass
class SimConfig:
    hosts: int = 4
    gpus_per_host: int = 4
    leaves: int = 4
    spines: int = 2
    jobs: int = 1
    share_hosts: bool = False  # every job on every host, each on its own GPUs and their NICs
    collective: str = "ring"  # ring | tree, or a list per job: "ring,tree"
    transport: str = "nccl"
    channels: int = 0  # 0: one per GPU
    step_time: float = 1.0
    ops_per_step: int = 4
    comm_fraction: float = 0.3
    noise: float = 0.05
    duration: float = 120.0
    interval: float = 1.0
    faults: list[Fault] = field(default_factory=list)
    seed: int = 0
    max_skew: float = 5.0
    slowdown: float = 3.0
    straggler_delay: float = 0.2
    realism: bool = True
    restart_at: list[float] = field(default_factory=list)
    restart_downtime: float = 20.0
    late_join: float = 8.0
    slow_start: float = 0.0  # up to this long one host's ranks start the first collective late
    stall_event_s: float = 5.0
    nic_gbps: float = 400.0

    def validate(self) -> None:
        if not set(self.collective.split(",")) <= {"ring", "tree"}:
            raise SimError(f"--collective: expected ring, tree or a list of them per job, got "
                           f"{self.collective!r}")
        if self.transport not in TRANSPORTS:
            raise SimError(f"--transport: expected {' or '.join(TRANSPORTS)}, "
                           f"got {self.transport!r}")
        if self.transport == "tcp":
            bad = [f"{f.kind}:{f.target}" for f in self.faults if f.kind not in TCP_KINDS]
            if bad:
                raise SimError(f"--transport tcp: only {', '.join(TCP_KINDS)} faults, got "
                               f"{', '.join(bad)}")
        if self.jobs < 1 or self.jobs > self.hosts:
            raise SimError(f"--jobs: need 1..{self.hosts} (one host at least per job)")
        if self.share_hosts and (self.jobs > self.gpus_per_host or self.transport == "tcp"):
            raise SimError("--share-hosts: needs at most one job per GPU, and the nccl transport")
        if not 0.05 <= self.interval <= 60:
            raise SimError("--interval: expected 0.05..60 seconds")
        if self.duration < self.interval:
            raise SimError("--duration: shorter than one interval")
        if self.step_time <= 0 or self.ops_per_step < 1 or not 0 < self.comm_fraction < 1:
            raise SimError("--step-time, ops per step and comm fraction must be positive")
        if self.noise < 0 or self.slowdown < 1 or self.straggler_delay < 0 or self.max_skew < 0:
            raise SimError("--noise, --slowdown (>= 1), --straggler-delay and skew must be >= 0")


@dataclass
class Conn:
    """One send connection src -> dst on a channel (a NIC pair and its fabric path)."""

    src: int
    dst: int
    channel: int
    src_host: str
    dst_host: str
    src_dev: str
    dst_dev: str
    links: tuple[str, ...]
    mult: float = 1.0  # this interval's network time per byte, relative to nominal
    blip: float = 1.0  # transient congestion for one interval (clean-run realism)
    stuck: bool = False  # its NIC or link is down: data in flight never completes
    loss: float = 0.0  # packet loss rate on its path this interval (lossy links it crosses)
    sent: int = 0  # bytes it carried in the last interval (for the NICs' loss counters)
    tails: int = 0  # message tails lost in the last interval (ACK timeouts)


class Incarnation:
    """One run of a job (a communicator): created at launch, ended by a restart."""

    def __init__(self, comm: str, start: float, join: dict[str, float], init_s: float,
                 first_late: dict[str, float] | None = None) -> None:
        self.comm = comm
        self.start = start
        self.join = join
        # every host's ranks enter the first collective once init is done, a late one's
        # (loading data) after its delay: the others wait inside it until then
        ready = max(join.values()) + init_s
        self.ready = {h: ready + (first_late or {}).get(h, 0.0) for h in join}
        self.ops_start = max(self.ready.values())
        self.end: float | None = None
        self.exit: dict[str, float] = {}
        self.knots: list[tuple[float, float, float]] = [(self.ops_start, 0.0, 0.0)]  # (t, S, rate)
        self.frozen_at: float | None = None  # S where progress stopped
        self.stall_since: float | None = None
        self.culprits: set[int] = set()  # ranks that did not enter the stalled op
        self.inside: dict[int, str] = {}  # rank -> sigstop | kernel-hang: entered, stuck in it
        self.ahead: set[int] = set()  # finished the stuck op, wait in the next (pipelined ring)
        self.repeats: dict[int, list] = {}  # sigstopped rank -> [last summary, times repeated]
        self.stall_events: set[int] = set()

    def S(self, t: float) -> float:
        """Collective progress (ops completed, fractional) at true time t."""
        if t < self.ops_start:
            return 0.0
        i = bisect.bisect_right(self.knots, (t, math.inf, math.inf)) - 1
        t0, s0, rate = self.knots[max(i, 0)]
        return s0 + (t - t0) * rate

    def busy(self, t0: float, t1: float) -> float:
        """Seconds of [t0, t1) in which the job progressed (its connections carried data)."""
        # a few intervals back; knots are nearly in time order (stable: a freeze at the
        # instant of a knot comes after it)
        tail = sorted(self.knots[-16:], key=lambda k: k[0])
        end = self.end if self.end is not None else math.inf
        out = 0.0
        for (ta, _, rate), (tb, _, _) in zip(tail, tail[1:] + [(math.inf, 0.0, 0.0)]):
            if rate > 0:
                out += max(0.0, min(tb, t1, end) - max(ta, t0))
        return out

    def t_of(self, s: float) -> float:
        """First time progress reached s (s must have been reached)."""
        for t0, s0, rate in reversed(self.knots):
            if s0 <= s:
                return t0 + ((s - s0) / rate if rate > 0 else 0.0)
        return self.ops_start


class Job:
    def __init__(self, index: int, hosts: list[str], topo: Topology, cfg: SimConfig,
                 gpus: int = 0, gpu0: int = 0) -> None:
        self.index = index
        self.id = f"train-{index}"
        self.hosts = hosts
        self.G = gpus or cfg.gpus_per_host  # GPUs per host: its ranks' CUDA devices
        self.gpu0 = gpu0  # ... from this one on (jobs sharing hosts)
        self.nranks = len(hosts) * self.G
        self.host_of = [hosts[r // self.G] for r in range(self.nranks)]
        self.topo = topo
        self.cfg = cfg
        channels = cfg.channels or max(2, self.G)
        kinds = cfg.collective.split(",")
        self.collective = kinds[index % len(kinds)]
        self.conns = (self._build_tcp(topo) if cfg.transport == "tcp" else
                      self._build(channels, topo, self.collective))
        self.send_of: list[list[Conn]] = [[] for _ in range(self.nranks)]
        self.recv_of: list[list[Conn]] = [[] for _ in range(self.nranks)]
        self.first_rank = {h: i * self.G for i, h in enumerate(hosts)}
        self.tx_of: dict[str, list[Conn]] = {}  # NIC endpoint -> connections it sends
        self.rx_of: dict[str, list[Conn]] = {}
        nb: list[set[int]] = [set() for _ in range(self.nranks)]
        for c in self.conns:
            self.send_of[c.src].append(c)
            self.recv_of[c.dst].append(c)
            self.tx_of.setdefault(endpoint(c.src_host, c.src_dev), []).append(c)
            self.rx_of.setdefault(endpoint(c.dst_host, c.dst_dev), []).append(c)
            nb[c.src].add(c.dst)
            nb[c.dst].add(c.src)
        for r in range(self.nranks):  # NVLink neighbours inside the host also wait on r
            if self.G > 1:
                base = r - r % self.G
                nb[r].update((base + (r + 1) % self.G, base + (r - 1) % self.G))
            nb[r].discard(r)
        self.nbrs = [sorted(s) for s in nb]
        bw = cfg.nic_gbps * 1e9 / 8
        self.t_net0 = cfg.step_time * cfg.comm_fraction / cfg.ops_per_step
        self.t_compute = cfg.step_time * (1 - cfg.comm_fraction) / cfg.ops_per_step
        self.conn_bytes = int(self.t_net0 * bw)
        self.conn_steps = max(1, self.conn_bytes >> 19)
        self.op_bytes = self.conn_bytes * channels
        self.lat0 = 1.0 / bw  # seconds per byte at nominal speed
        self.incs: list[Incarnation] = []
        self.lateness = [0.0] * self.nranks
        self.lmax = 0.0  # this interval's largest lateness
        self.M = 1.0  # this interval's slowest connection multiplier
        self.pids = {r: 20000 + 100 * index + r % self.G for r in range(self.nranks)}

    def nic(self, r: int) -> str:
        nics = self.topo.hosts[self.host_of[r]].nics
        return nics[self.dev(r) % len(nics)].dev

    def dev(self, r: int) -> int:
        """Rank r's CUDA device on its host (a rank uses the NIC on its GPU's rail)."""
        return self.gpu0 + r % self.G

    def _build(self, channels: int, topo: Topology, collective: str) -> list[Conn]:
        H, G = len(self.hosts), self.G
        pairs: list[tuple[int, int, int]] = []
        if H >= 2:
            for c in range(channels):
                if collective == "ring":
                    g_in, g_out = c % G, (c - 1) % G
                    for i in range(H):
                        pairs.append((i * G + g_out, ((i + 1) % H) * G + g_in, c))
                else:  # two binary trees over the hosts, the second shifted by half
                    g = c % G
                    order = list(range(H)) if c % 2 == 0 else [(i + H // 2) % H for i in range(H)]
                    for pos in range(1, H):
                        child, parent = order[pos], order[(pos - 1) // 2]
                        pairs.append((child * G + g, parent * G + g, c))
                        pairs.append((parent * G + g, child * G + g, c))
        conns = []
        for src, dst, ch in pairs:
            sh, dh = self.host_of[src], self.host_of[dst]
            sd, dd = self.nic(src), self.nic(dst)
            links = topo.ecmp_route(sh, sd, dh, dd, salt=self.cfg.seed)
            topo.set_path(endpoint(sh, sd), endpoint(dh, dd), links)
            conns.append(Conn(src, dst, ch, sh, dh, sd, dd, tuple(links)))
        return conns

    def _build_tcp(self, topo: Topology) -> list[Conn]:
        """A gloo-like job, one process per host on its first NIC: a TCP connection to each
        ring neighbour and each halving-doubling partner (i XOR 2^k), both directions used.
        A connection's src/dst are the hosts' first ranks."""
        H, G = len(self.hosts), self.G
        pairs = {tuple(sorted((i, j))) for i in range(H)
                 for j in [(i + 1) % H] + [i ^ (1 << k) for k in range(H.bit_length())]
                 if j < H and j != i}
        conns = []
        for a, b in sorted(pairs):
            for i, j in ((a, b), (b, a)):
                sh, dh = self.hosts[i], self.hosts[j]
                sd, dd = self.nic(i * G), self.nic(j * G)
                links = topo.ecmp_route(sh, sd, dh, dd, salt=self.cfg.seed)
                topo.set_path(endpoint(sh, sd), endpoint(dh, dd), links)
                conns.append(Conn(i * G, j * G, 0, sh, dh, sd, dd, tuple(links)))
        return conns

    def current(self, t: float) -> Incarnation | None:
        for inc in reversed(self.incs):
            if inc.start <= t:
                return inc
        return None


class Simulator:
    def __init__(self, cfg: SimConfig) -> None:
        cfg.validate()
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.topo = Topology.leaf_spine(cfg.hosts, cfg.gpus_per_host, cfg.leaves, cfg.spines,
                                        nic_gbps=cfg.nic_gbps)
        names = list(self.topo.hosts)
        self.hosts = names
        if cfg.share_hosts:
            g = cfg.gpus_per_host // cfg.jobs
            self.jobs = [Job(j, names, self.topo, cfg, g, j * g) for j in range(cfg.jobs)]
        else:
            per = -(-len(names) // cfg.jobs)
            self.jobs = [Job(j, names[j * per:(j + 1) * per], self.topo, cfg)
                         for j in range(cfg.jobs) if names[j * per:(j + 1) * per]]
        self.jobs_on: dict[str, list[Job]] = {}  # host -> the jobs with ranks there
        for job in self.jobs:
            for h in job.hosts:
                self.jobs_on.setdefault(h, []).append(job)
        self.skew = {h: round(self.rng.uniform(-cfg.max_skew, cfg.max_skew), 3) for h in names}
        self.phase = {h: self.rng.uniform(0, cfg.interval) for h in names}
        self.boot = {h: f"{self.rng.getrandbits(48):012x}" for h in names}
        self.seq = {h: 0 for h in names}
        self.last_arrival: dict[str, float] = {}
        self.counters = {(h, n.dev): dict.fromkeys(COUNTERS, 0)
                         for h in names for n in self.topo.hosts[h].nics}
        self.faults = [self._check(f) for f in cfg.faults]
        self.addr = {h: f"10.0.{i // 250}.{i % 250 + 1}" for i, h in enumerate(names)}
        self.sockets: dict[tuple[str, str], list[int]] = {}  # (host, peer) -> acked, rcvd, retrans
        # (job index, rank) -> its process's CPU seconds and bytes written, with their own
        # random stream (the rest of a run does not change with them)
        self.usage: dict[tuple[int, int], list[float]] = {}
        self.urng = random.Random(cfg.seed * 1_000_003 + 17)
        self.boot_listed: dict[str, frozenset[str]] = {}  # host -> comms whose flows it listed
        self.clean_events: list[dict[str, Any]] = []
        self.blips: dict[int, list[tuple[str, Any]]] = {}
        # other tenants' congestion: (start, end, fabric link, direction, factor)
        self.bursts: list[tuple[float, float, str, str, float]] = []
        self.checkpoints: list[tuple[float, float, int]] = []  # (start, end, job index)
        self.pauses: list[Fault] = []  # a checkpoint writer's pause, as a healed `hang`
        self._plan_realism()
        for job in self.jobs:
            self._launch(job, 0.0, late=cfg.realism)
        self.frames = 0

    # -- setup ------------------------------------------------------------------------------
    def _check(self, f: Fault) -> Fault:
        hosts = self.topo.hosts
        if f.kind in RANK_KINDS:
            if not f.target.isdigit() or int(f.target) >= len(hosts) * self.cfg.gpus_per_host:
                raise SimError(f"fault {f.kind}: target {f.target!r} is not a rank of this cluster")
            if self.rank_ref(int(f.target))[0] is None:
                raise SimError(f"fault {f.kind}: rank {f.target} runs no job")
        elif f.kind == "slow-link":
            pair = f.target.split(",")
            if len(pair) != 2 or not all(p in hosts for p in pair) or pair[0] == pair[1]:
                raise SimError(f"fault slow-link: target {f.target!r} is not HOST,HOST")
        elif f.kind in ("lossy-link", "slow-fabric"):
            if f.target not in self.topo.links or self.topo.links[f.target].kind != "fabric":
                raise SimError(f"fault {f.kind}: {f.target!r} is not a fabric link")
        elif f.kind in ("nic-down", "link-flap", "pfc-storm", "aer") or "/" in f.target:
            h, _, dev = f.target.partition("/")
            if h not in hosts or hosts[h].nic(dev) is None:
                raise SimError(f"fault {f.kind}: {f.target!r} is not HOST/DEV of a NIC")
        elif f.target not in hosts:
            raise SimError(f"fault {f.kind}: {f.target!r} is not a host")
        return f

    def rank_ref(self, gindex: int) -> tuple[Job | None, int]:
        """A global GPU index (host index * gpus + gpu) -> (job, rank in that job)."""
        host = self.hosts[gindex // self.cfg.gpus_per_host]
        gpu = gindex % self.cfg.gpus_per_host
        for job in self.jobs_on.get(host, []):
            if job.gpu0 <= gpu < job.gpu0 + job.G:
                return job, job.hosts.index(host) * job.G + gpu - job.gpu0
        return None, -1

    def _plan_realism(self) -> None:
        """Clean-run noise that must not raise incidents: one-off slow steps, transient
        congestion on one connection, one rank late for one op (GC pause), other tenants'
        congestion on a fabric link (2-6 s, 1.8-4x, one direction), checkpoints (every rank
        pauses between collectives for 10-40 s, or half of them: rank 0 writes while the others
        wait for it inside the next collective)."""
        if not self.cfg.realism:
            return
        fabric = sorted(lk for lk, x in self.topo.links.items() if x.kind == "fabric")
        t = self.rng.expovariate(1 / 120.0)
        while t < self.cfg.duration and fabric:  # about one burst per 2 minutes
            d = self.rng.uniform(2.0, 6.0)
            lk = self.rng.choice(fabric)
            self.bursts.append((t, t + d, lk, self.rng.choice(("up", "down")),
                                self.rng.uniform(1.8, 4.0)))
            self.clean_events.append({"kind": "tenant_burst", "t": round(t, 2), "link": lk,
                                      "s": round(d, 2)})
            t += self.rng.expovariate(1 / 120.0)
        for job in self.jobs:
            t = self.rng.uniform(120.0, 600.0)
            while t < self.cfg.duration:
                d = self.rng.uniform(10.0, 40.0)
                self.checkpoints.append((t, t + d, job.index))
                self.clean_events.append({"kind": "checkpoint", "t": round(t, 2),
                                          "job": job.id, "s": round(d, 2)})
                t += d + self.rng.uniform(300.0, 900.0)
        n = int(self.cfg.duration / self.cfg.interval)
        per_h = self.cfg.interval / 3600.0
        for k in range(n):
            for kind, rate in (("slow_step", 30), ("conn_blip", 60), ("rank_blip", 30)):
                if self.rng.random() >= rate * per_h:
                    continue
                job = self.rng.choice(self.jobs)
                if kind == "conn_blip" and not job.conns:
                    continue
                arg = (self.rng.randrange(len(job.conns)) if kind == "conn_blip" else
                       self.rng.randrange(job.nranks) if kind == "rank_blip" else None)
                self.blips.setdefault(k, []).append((kind, (job.index, arg)))
                self.clean_events.append({"kind": kind, "t": k * self.cfg.interval,
                                          "job": job.id})
        for a, b, j in list(self.checkpoints):
            if self.rng.random() < 0.5:  # the writer stops calling collectives; healed at b
                self.checkpoints.remove((a, b, j))
                g = self.hosts.index(self.jobs[j].hosts[0]) * self.cfg.gpus_per_host + \
                    self.jobs[j].gpu0
                self.pauses.append(Fault("hang", str(g), a, b))
                for e in self.clean_events:
                    if e["kind"] == "checkpoint" and e["t"] == round(a, 2):
                        e["kind"] = "checkpoint_inside"

    def _launch(self, job: Job, t: float, late: bool) -> None:
        rng = self.rng
        join = {}
        for h in job.hosts:
            join[h] = t + (rng.uniform(0, self.cfg.late_join) if late and rng.random() < 0.25
                           else rng.uniform(0, 0.5))
        comm = f"{rng.getrandbits(64):016x}"
        late_h = {}
        if late and self.cfg.slow_start and rng.random() < 0.5:  # a host still loading data
            late_h[rng.choice(job.hosts)] = rng.uniform(0.2, 1.0) * self.cfg.slow_start
        job.incs.append(Incarnation(comm, t, join, 2.0, late_h))

    # -- truth --------------------------------------------------------------------------------
    def truth(self) -> dict[str, Any]:
        out = []
        for f in self.faults:
            cls, _ = FAULT_KINDS[f.kind]
            item: dict[str, Any] = {"kind": f.kind, "target": f.target, "start": f.start,
                                    "end": f.end, "class": cls}
            item.update(self._suspect(f))
            if self.spins(f):
                item["spins"] = True
            out.append(item)
        return {
            "faults": out,
            "epoch": EPOCH,
            "clock_skew": self.skew,
            "clean_events": self.clean_events,
            "jobs": [{"id": j.id, "hosts": j.hosts, "nranks": j.nranks,
                      "comms": [i.comm for i in j.incs]} for j in self.jobs],
            "config": {k: v for k, v in self.cfg.__dict__.items() if k != "faults"},
        }

    def spins(self, f: Fault) -> bool:
        """Whether a `hang` fault's rank spins (burns a CPU) rather than blocks: drawn per
        fault, independently of the run's random stream."""
        return f.kind == "hang" and random.Random(
            f"{self.cfg.seed}:{f.target}:{f.start}").random() < SPIN_SHARE

    def _proc(self, job: Job, r: int, t: float, state: str) -> dict[str, Any]:
        """The owners entry of rank r's process at t: its counters advanced over the last
        interval by what it did then (trains, writes a checkpoint, hangs blocked or
        spinning, stopped)."""
        g = self.hosts.index(job.host_of[r]) * self.cfg.gpus_per_host + job.gpu0 + r % job.G
        doing = "train"
        for f in self.faults + self.pauses:
            if f.kind in RANK_KINDS and f.target == str(g) and f.active(t):
                doing = ("stopped" if f.kind == "sigstop" else "write" if f in self.pauses
                         else "spin" if f.kind == "kernel-hang" or self.spins(f) else
                         "blocked" if f.kind in ("hang", "xid") else doing)
        if doing == "train" and any(j == job.index and a <= t < b for a, b, j in self.checkpoints):
            doing = "write"
        if state == "T":  # a TCP job's hung rank is a stopped process (the lab's SIGSTOP)
            doing = "stopped"
        iv, u = self.cfg.interval, self.urng
        cpu = {"train": CPU_TRAIN, "write": CPU_WRITE, "blocked": CPU_BLOCKED,
               "spin": CPU_SPIN}.get(doing)
        st = self.usage.setdefault((job.index, r), [u.uniform(20.0, 60.0), 4096.0 * (r + 1)])
        if cpu is not None:
            st[0] += u.uniform(*cpu) * iv
        if doing == "write":
            st[1] += int(u.uniform(*WRITE_BPS) * iv)
        return {"pid": job.pids[r], "state": state, "cpu_s": round(st[0], 2),
                "written": int(st[1]), "job": job.id}

    def _suspect(self, f: Fault) -> dict[str, Any]:
        t = f.target
        if f.kind in RANK_KINDS:
            job, r = self.rank_ref(int(t))
            assert job is not None
            host = job.host_of[r]
            if f.kind == "xid":
                pci = xid_pci(self.topo.hosts[host].gpu_pci[job.dev(r)])
                return {"suspect": {"kind": "gpu", "id": f"{host}/{pci}", "host": host},
                        "job": job.id, "rank": r}
            kind, sid = ("rank", str(r)) if f.kind == "straggler" else ("host", host)
            return {"suspect": {"kind": kind, "id": sid, "host": host}, "job": job.id, "rank": r}
        if f.kind == "slow-link":
            a, b = t.split(",")
            return {"suspect": {"kind": "link", "id": pair_id(a, b), "host": None},
                    "job": self._job_id(a)}
        if f.kind in ("lossy-link", "slow-fabric"):
            d = f.params.get("dir")
            return {"suspect": {"kind": "link", "id": t, "host": None}, "job": None,
                    "connections": sum(_crosses(c, t, d) for j in self.jobs for c in j.conns)}
        host = t.partition("/")[0]
        kind = "nic" if "/" in t else "host"
        return {"suspect": {"kind": kind, "id": t, "host": host}, "job": self._job_id(t)}

    def _job_id(self, target: str) -> str | None:
        """The job a host's or NIC's fault hits: the one whose ranks use that NIC (jobs
        sharing a host use different NICs), else the host's first."""
        host, _, dev = target.partition("/")
        jobs = self.jobs_on.get(host, [])
        for job in jobs if dev else ():
            r0 = job.hosts.index(host) * job.G
            if any(job.nic(r) == dev for r in range(r0, r0 + job.G)):
                return job.id
        return jobs[0].id if jobs else None

    # -- the run ------------------------------------------------------------------------------
    def run(self, out: str | Path) -> dict[str, Any]:
        out = Path(out)
        if out.exists():
            out.unlink()
        pending: list[tuple[float, int, bytes]] = []
        n = int(round(self.cfg.duration / self.cfg.interval))
        order = 0
        with record.Writer(out) as w:
            for h in self.topo.hosts:
                pending.append((self.phase[h] - self.cfg.interval + 0.001, order,
                                self._frame(h, "hello", self._hello(h),
                                            self.phase[h] - self.cfg.interval)))
                order += 1
            for k in range(n):
                t0 = k * self.cfg.interval
                for kind, arg in self.blips.get(k, []):
                    self._apply_blip(kind, arg)
                for job in self.jobs:
                    self._advance(job, k, t0, t0 + self.cfg.interval)
                for arrival, data in self._interval(k, t0):
                    pending.append((arrival, order, data))
                    order += 1
                pending.sort()
                cut = bisect.bisect_left(pending, (t0 + self.cfg.interval, -1, b""))
                for _, _, data in pending[:cut]:
                    w.write(data)
                del pending[:cut]
                for job in self.jobs:
                    job.lateness = [0.0] * job.nranks
            for _, _, data in sorted(pending):
                w.write(data)
        Path(f"{out}.truth.json").write_text(json.dumps(self.truth(), indent=1))
        self.topo.save(f"{out}.topology.json")
        return {"frames": self.frames, "hosts": len(self.topo.hosts),
                "ranks": sum(j.nranks for j in self.jobs), "duration": self.cfg.duration}

    def _apply_blip(self, kind: str, arg: tuple[int, Any]) -> None:
        job = self.jobs[arg[0]]
        if kind == "conn_blip":
            job.conns[arg[1]].blip = 3.0
        elif kind == "rank_blip":
            job.lateness[arg[1]] += 0.4

    # -- progress model -----------------------------------------------------------------------
    def _advance(self, job: Job, k: int, t0: float, t1: float) -> None:
        """Extend the job's progress curve over [t0, t1): restarts, fault effects, freezes."""
        cfg = self.cfg
        for tr in cfg.restart_at:
            if t0 <= tr < t1:
                self._restart(job, tr)
        faults = [f for f in self.faults if f.active(t0) or (t0 <= f.start < t1)]
        bursts = [b for b in self.bursts if b[0] < t1 and b[1] > t0]
        for c in job.conns:
            m = c.blip
            c.blip = 1.0
            if cfg.noise:
                m *= math.exp(self.rng.gauss(0.0, cfg.noise))
            c.loss = sum(_loss(f, cfg.slowdown) for f in faults
                         if f.kind == "lossy-link" and _crosses(c, f.target, f.params.get("dir")))
            m *= _loss_slowdown(c.loss)
            for f in faults:
                m *= self._conn_fault(f, c)
            for b0, b1, lk, d, x in bursts:  # share of the interval the burst covers
                if _crosses(c, lk, d):
                    m *= 1 + (x - 1) * (min(b1, t1) - max(b0, t0)) / (t1 - t0)
            c.mult = m
            c.stuck = any(self._conn_stuck(f, c) for f in faults if f.kind == "nic-down")
        for f in faults:
            if f.kind == "straggler":
                fj, r = self.rank_ref(int(f.target))
                if fj is job:
                    job.lateness[r] += cfg.straggler_delay
        job.M = max((c.mult for c in job.conns), default=1.0)
        job.lmax = max(job.lateness)
        slow_step = any(kind == "slow_step" and arg[0] == job.index
                        for kind, arg in self.blips.get(k, []))
        period = job.t_compute * (3.0 if slow_step else 1.0) + job.lmax + job.t_net0 * job.M
        pause = any(j == job.index and a <= t0 < b for a, b, j in self.checkpoints)
        for inc in job.incs:
            if inc.start < t1 and (inc.end is None or inc.end > t0):
                self._progress(job, inc, t0, t1, 1.0 / period, pause)

    def _progress(self, job: Job, inc: Incarnation, t0: float, t1: float, rate: float,
                  pause: bool = False) -> None:
        lo = max(t0, inc.ops_start)
        hi = min(t1, inc.end) if inc.end is not None else t1
        if lo >= hi:
            return
        hangs = [f for f in self.faults + self.pauses
                 if f.kind in HANG_KINDS and self._hits_job(f, job)]
        active = [f for f in hangs if f.active(lo)]
        starting = [f for f in hangs if lo < f.start < hi]
        if inc.frozen_at is not None:
            if not active and not starting:  # healed: the stuck op completes, work goes on
                inc.knots.append((lo, inc.frozen_at, rate))
                inc.frozen_at = inc.stall_since = None
                inc.culprits.clear()
                inc.inside.clear()
                inc.ahead.clear()
                inc.repeats.clear()
                inc.stall_events.clear()
            return
        s_lo = inc.S(lo)
        if pause and not (active or starting):  # a checkpoint: finish the op, then idle
            cf = job.t_compute / (job.t_compute + job.t_net0)
            s_end = s_lo if s_lo % 1 < cf else math.floor(s_lo) + 1.001
            inc.knots.append((lo, s_lo, rate))
            inc.knots.append((lo + (s_end - s_lo) / rate, s_end, 0.0))
            return
        inc.knots.append((lo, s_lo, rate))
        if active or starting:
            tf = max(lo, min(f.start for f in active + starting))
            self._freeze(job, inc, tf, active + starting, rate)
        elif inc.end is not None and inc.end < t1:
            inc.knots.append((inc.end, inc.S(inc.end), 0.0))

    def _freeze(self, job: Job, inc: Incarnation, tf: float, faults: list[Fault],
                rate: float) -> None:
        cf = job.t_compute / (job.t_compute + job.t_net0)
        s = inc.S(tf)
        base, frac = math.floor(s), s - math.floor(s)
        noncomm = any(f.kind not in INSIDE_KINDS for f in faults)
        if noncomm:  # the op in flight completes, then the culprit never enters the next
            stop = base + (1 if frac >= cf else 0) + cf
        else:  # everyone enters; the dead NIC's connections never complete
            stop = base + cf if frac < cf else s
        t_stop = tf + (stop - s) / rate
        inc.knots.append((t_stop, stop, 0.0))
        inc.frozen_at, inc.stall_since = stop, t_stop
        for f in faults:
            if f.kind in ("hang", "xid"):
                fj, r = self.rank_ref(int(f.target))
                if fj is job:
                    inc.culprits.add(r)
            elif f.kind == "host-down":
                inc.culprits.update(r for r in range(job.nranks) if job.host_of[r] == f.target)
            elif f.kind in ("sigstop", "kernel-hang"):
                fj, r = self.rank_ref(int(f.target))
                if fj is job:
                    inc.inside[r] = f.kind
                    if f.kind == "sigstop" and self._downstream_done(job, f, stop - base, cf):
                        # A pipelined ring stopped late in the op: the culprit had already
                        # forwarded what its successor still needed, so that rank finishes the
                        # op (the lab saw it) and waits in the next one, ahead of everyone.
                        nxt = job.send_of[r][0].dst if job.send_of[r] else None
                        if nxt is not None and nxt not in inc.inside:
                            inc.ahead.add(nxt)

    @staticmethod
    def _downstream_done(job: Job, f: Fault, frac: float, cf: float) -> bool:
        """Whether the culprit stopped after forwarding its successor's last data: `ahead=`
        says so, else a ring stopped in the second half of the op's communication does."""
        if "ahead" in f.params:
            return f.params["ahead"] == "1"
        return job.collective == "ring" and frac >= cf + (1 - cf) / 2

    def _restart(self, job: Job, tr: float) -> None:
        inc = job.current(tr)
        if inc is not None and inc.end is None:
            inc.end = tr
            inc.exit = {h: tr + self.rng.uniform(0, 1.0) for h in job.hosts}
        self._launch(job, tr + self.cfg.restart_downtime, late=True)
        self.clean_events.append({"kind": "restart", "t": tr, "job": job.id})

    def _hits_job(self, f: Fault, job: Job) -> bool:
        if f.kind in RANK_KINDS:
            return self.rank_ref(int(f.target))[0] is job
        host = f.target.partition("/")[0]
        if f.kind == "nic-down":
            return any(self._conn_stuck(f, c) for c in job.conns)
        return host in job.hosts

    def _conn_fault(self, f: Fault, c: Conn) -> float:
        x = float(f.params.get("x", self.cfg.slowdown))
        if f.kind == "slow-node":
            if "/" in f.target:
                return x if f.target in (f"{c.src_host}/{c.src_dev}", f"{c.dst_host}/{c.dst_dev}") else 1.0
            return x if f.target in (c.src_host, c.dst_host) else 1.0
        if f.kind == "slow-link":
            return x if _pair_hit(f, c) else 1.0
        if f.kind == "slow-fabric":
            return x if _crosses(c, f.target, f.params.get("dir")) else 1.0
        if f.kind in ("pfc-storm", "link-flap") and self._conn_stuck(f, c):
            return 1.0 + (x - 1.0) / 2
        return 1.0

    @staticmethod
    def _conn_stuck(f: Fault, c: Conn) -> bool:
        return f.target in (f"{c.src_host}/{c.src_dev}", f"{c.dst_host}/{c.dst_dev}")

    # -- frames -------------------------------------------------------------------------------
    def _frame(self, host: str, kind: str, body: dict[str, Any], t: float) -> bytes:
        self.seq[host] += 1
        self.frames += 1
        ts = max(0.0, round(t + EPOCH + self.skew[host], 6))
        # Validating every report costs more than generating it; each host's first few and
        # every hello/event are validated, and a replay validates all of them on decode.
        check = kind != "report" or self.seq[host] <= 3
        return encode(Frame(kind, host, self.boot[host], self.seq[host], ts, body), check)

    def _collectors(self) -> tuple[str, ...]:
        if self.cfg.transport == "tcp":
            return ("host", "rdma", "kmsg", "pfc", "tcp_flows")
        return ("host", "rdma", "kmsg", "pfc", "nccl") + (("tcp_flows",) if self.cfg.realism
                                                          else ())

    def _hello(self, host: str) -> dict[str, Any]:
        h = self.topo.hosts[host]
        hello = {
            "agent_version": "0.1.0-sim", "interval": self.cfg.interval,
            "collectors": {c: {"ok": True} for c in self._collectors()},
            "nics": [{"dev": n.dev, "ports": [{"port": 1, "state": "ACTIVE",
                                               "link_layer": "Ethernet", "rate_gbps": n.gbps,
                                               "netdev": n.netdev, "rail": n.rail}]}
                     for n in h.nics],
            "labels": {"leaf": h.nics[0].leaf, "sim": "1"},
        }
        if self.cfg.transport == "tcp" or self.cfg.realism:  # TCP over the first NIC's netdev
            hello["netdevs"] = [{"name": n.netdev, "addrs": [f"{self.addr[host]}/16"] if i == 0
                                 else []} for i, n in enumerate(h.nics)]
        return hello

    def _interval(self, k: int, t0: float) -> Iterator[tuple[float, bytes]]:
        """Every frame whose true send time falls in [t0, t0 + interval), each host's in its
        send order (one connection: frames of a host arrive in seq order)."""
        cfg = self.cfg
        for host in self.topo.hosts:
            t = t0 + self.phase[host]
            if self._host_down(host, t):
                continue
            out: list[tuple[float, str, dict[str, Any]]] = []
            if self._host_back(host, t):
                self.boot[host] = f"{self.rng.getrandbits(48):012x}"
                self.seq[host] = 0
                out.append((t - 0.01, "hello", self._hello(host)))
            out += [(et, "event", ev) for et, ev in self._events(host, t0, t0 + cfg.interval)]
            out.append((t, "report", self._report(host, t, k)))
            out.sort(key=lambda x: x[0])
            arrival = self.last_arrival.get(host, -1e9)
            for ts, kind, body in out:
                arrival = max(arrival + 1e-4, ts + self.rng.uniform(0.001, 0.02))
                yield arrival, self._frame(host, kind, body, ts)
            self.last_arrival[host] = arrival

    def _host_down(self, host: str, t: float) -> bool:
        return any(f.kind == "host-down" and f.target == host and f.active(t) for f in self.faults)

    def _host_back(self, host: str, t: float) -> bool:
        return any(f.kind == "host-down" and f.target == host and f.end is not None
                   and f.end <= t < f.end + self.cfg.interval for f in self.faults)

    def _report(self, host: str, t: float, k: int) -> dict[str, Any]:
        cfg = self.cfg
        body: dict[str, Any] = {
            "interval": round(cfg.interval + self.rng.uniform(-0.002, 0.002), 4),
            "health": {c: {"ok": True} for c in self._collectors()},
            "host": {"cpu_pct": round(self.rng.uniform(30, 60) * 16, 1), "load1": 40.0,
                     "mem_used_bytes": 600 << 30, "mem_total_bytes": 2048 << 30,
                     "uptime_s": 86400.0 + t},
        }
        traffic: dict[str, list[int]] = {n.dev: [0, 0] for n in self.topo.hosts[host].nics}
        comms: list[dict[str, Any]] = []
        tcp = self._tcp_section([])
        boot: list[tuple[Job, Incarnation]] = []
        for job in self.jobs_on.get(host, []):
            inc = job.current(t)
            live = inc is not None and inc.join[host] <= t and (inc.end is None or
                                                                t < inc.exit[host])
            if live and self.cfg.transport == "nccl":
                comms += self._comms(job, inc, host, t, traffic)  # type: ignore[arg-type]
                boot.append((job, inc))  # type: ignore[arg-type]
            elif live:
                tcp = self._tcp_flows(job, inc, host, t)  # type: ignore[arg-type]
        if self.cfg.transport == "tcp":
            body["tcp_flows"] = tcp
        else:
            body["nccl"] = {"comms": comms}
            if self.cfg.realism:
                body["tcp_flows"] = self._bootstrap(host, boot, t)
        body["rdma"] = {"ports": self._ports(host, t, traffic)}
        return body

    def _comms(self, job: Job, inc: Incarnation, host: str, t: float,
               traffic: dict[str, list[int]]) -> list[dict[str, Any]]:
        cfg, rng = self.cfg, self.rng
        iv = cfg.interval
        s_now, s_prev = inc.S(t), inc.S(t - iv)
        cf = job.t_compute / (job.t_compute + job.t_net0)
        frozen = inc.frozen_at is not None and inc.stall_since is not None and inc.stall_since <= t
        lmax, M = job.lmax, job.M
        sig = cfg.noise * job.t_compute
        first = job.first_rank[host]
        out = []
        for r in range(first, first + job.G):
            rep = inc.repeats.get(r) if frozen and inc.inside.get(r) == "sigstop" else None
            if rep is not None:  # stopped: the agent repeats its last summary, then drops it
                rep[1] += 1
                if rep[1] <= AGENT_REPEATS:
                    out.append(rep[0])
                continue
            culprit = r in inc.culprits and frozen
            if culprit:
                done = started = math.floor(inc.frozen_at)  # type: ignore[arg-type]
                n = done - math.floor(s_prev)
            elif frozen and r in inc.ahead:  # completed the stuck op, inside the next one
                done = math.floor(inc.frozen_at) + 1  # type: ignore[arg-type]
                started = done + 1
                n = done - math.floor(s_prev)
            else:
                done = math.floor(s_now)
                started = done + (1 if s_now - done >= cf - 1e-9 else 0)
                n = done - math.floor(s_prev)
            starting = inc.ready[host] <= t < inc.ops_start  # in op 0, a late host not yet
            if starting:
                started = 1
            inflight = None
            oldest = ordinals.oldest_incomplete(started, done)
            if oldest is not None:
                t_enter = inc.ready[host] if starting else inc.t_of(done + cf)
                prog = (t - inc.stall_since) if frozen else \
                    (t - t_enter) if starting else rng.uniform(0.0, 0.05)
                inflight = {"seq": oldest, "func": "AllReduce",
                            "age_s": round(max(0.0, t - t_enter), 4),
                            "progress_age_s": round(max(0.0, prog), 4)}
                if frozen and prog >= cfg.stall_event_s and r not in inc.stall_events:
                    inc.stall_events.add(r)
            s: dict[str, Any] = {
                "comm": inc.comm, "rank": r, "nranks": job.nranks, "seq_started": started,
                "seq_completed": done, "pid": job.pids[r], "job": job.id, "dev": job.dev(r),
                "inflight": inflight, "colls": [], "peers": [],
            }
            if frozen and inc.inside.get(r) == "sigstop":
                inc.repeats[r] = [dict(s), 0]  # cumulative fields only: deltas are cleared
            if n > 0:
                late = max(job.lateness[p] for p in job.nbrs[r]) if job.nbrs[r] else 0.0
                own = job.lateness[r]
                op = job.t_net0 * M + lmax - own + 3.0 * sig
                s["colls"] = [{"func": "AllReduce", "count": n, "bytes": n * job.op_bytes,
                               "time_s": round(max(1e-4, n * op * (1 + 0.02 * rng.gauss(0, 1))), 6),
                               "algo": "Ring" if job.collective == "ring" else "Tree",
                               "proto": "Simple"}]
                ew = n * (max(0.0, late - own) + sig * max(0.0, 0.85 + 0.6 * rng.gauss(0, 1) / math.sqrt(n)))
                s["entry_wait_s"] = round(ew, 6)
                s["entry_ops"] = n
            for c in job.send_of[r]:
                b = n * job.conn_bytes
                c.sent = b
                # lost message tails wait for the ACK timeout: tail latency before slowdown
                c.tails = _poisson(rng, b / MSG_BYTES * c.loss * 2) if c.loss else 0
                net = b * job.lat0 * c.mult + c.tails * ACK_TIMEOUT_S
                e = {"peer": c.dst, "channel": c.channel, "dir": "send", "bytes": b,
                     "steps": n * job.conn_steps, "net_wait_s": round(net, 6),
                     "peer_wait_s": round(max(0.0, n * job.t_net0 * M - net), 6),
                     "gpu_wait_s": round(n * 0.002, 6)}
                # a stuck step accrues no time until it changes state (docs/plugin.md): a
                # stall shows only in the plugin's stall messages
                s["peers"].append(e)
                traffic[c.src_dev][0] += b
            for c in job.recv_of[r]:
                b = n * job.conn_bytes
                e = {"peer": c.src, "channel": c.channel, "dir": "recv", "bytes": b,
                     "steps": n * job.conn_steps,
                     "net_wait_s": round(n * job.t_net0 * M, 6)}
                s["peers"].append(e)
                traffic[c.dst_dev][1] += b
            out.append(s)
        return out

    def _tcp_flows(self, job: Job, inc: Incarnation, host: str, t: float) -> dict[str, Any]:
        """Every socket of the host's process (a refresh each interval): per direction, goodput
        falls and srtt rises with the connection's slowdown, retransmits with its loss; bytes
        move only while the job progresses. A stopped process (hang, sigstop) is `T` in the
        owners, and its peers' probes find its receive window closed."""
        iv, rng = self.cfg.interval, self.rng
        me = job.hosts.index(host)
        faults = [f for f in self.faults if f.active(t)]
        stopped = {job.host_of[r]: f.start for f in faults if f.kind in ("hang", "sigstop")
                   for fj, r in [self.rank_ref(int(f.target))] if fj is job}
        busy = inc.busy(t - iv, t) / iv
        sent = {c.dst_host: c for c in job.send_of[me * job.G]}
        got = {c.src_host: c for c in job.recv_of[me * job.G]}
        flows = []
        for peer, c in sent.items():
            acked = int(TCP_GOODPUT * iv * busy / c.mult)
            loss = TCP_LOSS_PER_MB
            for f in faults:
                if self._conn_fault(f, c) > 1.0:
                    loss *= TCP_LOSS.get(f.kind, 1.0)
            loss += c.loss * 1e6 / 1448  # a lost segment per lost packet of MSS bytes
            retrans = _poisson(rng, loss * acked / 1e6)
            rcvd = int(TCP_GOODPUT * iv * busy / got[peer].mult) if peer in got else 0
            st = self.sockets.setdefault((host, peer), [0, 0, 0, 0])
            st[0] += acked
            st[1] += rcvd
            st[2] += retrans
            zero = peer in stopped and _probed(t - iv - stopped[peer], t - stopped[peer])
            st[3] += zero
            other = job.hosts.index(peer)
            # the lower host index connected: it holds the ephemeral port
            sport, dport = ((40000 + other, TCP_PORT) if me < other else
                            (TCP_PORT, 40000 + me))
            flows.append({
                "saddr": self.addr[host], "daddr": self.addr[peer], "sport": sport,
                "dport": dport, "family": "ipv4", "netns": 4026531840,
                "pid": job.pids[me * job.G], "comm": "python3", "state": "ESTABLISHED",
                "bytes_acked": st[0], "bytes_received": st[1], "retrans_segs": st[2],
                "bytes_acked_delta": acked, "bytes_received_delta": rcvd,
                "retrans_segs_delta": retrans, "bytes_acked_rate": acked / iv,
                "bytes_received_rate": rcvd / iv,
                "srtt_us": int(TCP_SRTT_US * c.mult * math.exp(rng.gauss(0.0, 0.05))),
                "cwnd": 10 + int(rng.uniform(0, 200) / c.mult), "closed": False,
                "job": job.id})
            if st[3]:
                flows[-1].update(zero_window=st[3], zero_window_delta=int(zero))
        state = "T" if host in stopped else "R" if busy > 0.5 else "S"
        return self._tcp_section(flows, [self._proc(job, me * job.G, t, state)])

    def _bootstrap(self, host: str, live: list[tuple[Job, "Incarnation"]],
                   t: float) -> dict[str, Any]:
        """What the tcp_flows collector sees of NCCL jobs: each rank's socket to the
        rendezvous store on the job's first host and the bootstrap ring's socket to the next
        host, a few KB at init and idle after. The agent lists them when processes start or
        exit (a refresh: every tracked flow) and never otherwise; the processes are in the
        owners every report (`T` from a sigstop on)."""
        flows: list[dict[str, Any]] = []
        owners: list[dict[str, Any]] = []
        procs = frozenset(inc.comm for _, inc in live)
        fresh = self.boot_listed.get(host) != procs  # started or exited: a refresh
        self.boot_listed[host] = procs
        sigstop = {self.rank_ref(int(f.target)) for f in self.faults
                   if f.kind == "sigstop" and f.active(t)}
        for job, _ in live:
            me = job.hosts.index(host)
            for r in range(job.first_rank[host], job.first_rank[host] + job.G):
                owners.append(self._proc(job, r, t, "T" if (job, r) in sigstop else "R"))
                peers = [(job.hosts[0], TCP_PORT)] if me else []  # the store (c10d)
                if r == job.first_rank[host] + job.G - 1 and len(job.hosts) > 1:
                    peers.append((job.hosts[(me + 1) % len(job.hosts)], BOOT_PORT))
                sport = 32768 + (len(job.incs) * 1000 + r * 2) % 28000
                for i, (peer, dport) in enumerate(peers):
                    flows.append({
                        "saddr": self.addr[host], "daddr": self.addr[peer], "sport": sport + i,
                        "dport": dport, "family": "ipv4", "netns": 4026531840,
                        "pid": job.pids[r], "comm": "python3", "state": "ESTABLISHED",
                        "bytes_acked": 4096, "bytes_received": 4096, "retrans_segs": 0,
                        "bytes_acked_delta": 4096, "bytes_received_delta": 4096,
                        "retrans_segs_delta": 0, "bytes_acked_rate": 4096 / self.cfg.interval,
                        "bytes_received_rate": 4096 / self.cfg.interval,
                        "srtt_us": int(TCP_SRTT_US), "cwnd": 10, "closed": False,
                        "job": job.id})
        section = self._tcp_section(flows if fresh else [], owners)
        section.update(refresh=fresh, tracked=len(flows), unchanged=0 if fresh else len(flows))
        return section

    @staticmethod
    def _tcp_section(flows: list[dict[str, Any]],
                     owners: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        out = {"flows": flows, "omitted": 0, "tracked": len(flows), "unchanged": 0,
               "refresh": True, "map_full": 0, "drops": {}, "drops_delta": {}}
        if owners:
            out["owners"] = owners
        return out

    def _ports(self, host: str, t: float, traffic: dict[str, list[int]]) -> list[dict[str, Any]]:
        cfg, rng = self.cfg, self.rng
        iv = cfg.interval
        jobs = self.jobs_on.get(host, [])
        ports = []
        for nic in self.topo.hosts[host].nics:
            key = (host, nic.dev)
            d = dict.fromkeys(COUNTERS, 0)
            d["port_xmit_data"] = traffic[nic.dev][0] // 4
            d["port_rcv_data"] = traffic[nic.dev][1] // 4
            d["np_ecn_marked_roce_packets"] = _poisson(rng, 2.0 * iv)
            d["np_cnp_sent"] = d["np_ecn_marked_roce_packets"]
            d["rp_cnp_handled"] = _poisson(rng, 2.0 * iv)
            ep = endpoint(host, nic.dev)
            rx = [c for job in jobs for c in job.rx_of.get(ep, [])]  # every job's traffic
            tx = [c for job in jobs for c in job.tx_of.get(ep, [])]
            down = False
            for f in self.faults:
                if not f.active(t):
                    continue
                if f.kind in ("nic-down", "link-flap") and f.target == ep:
                    down = f.kind == "nic-down" or (t - f.start) % 10 < iv
                    d["link_downed"] += 1 if (t - f.start) < iv or f.kind == "link-flap" and down else 0
                if f.kind != "slow-link":
                    continue
                for c in rx:
                    if _pair_hit(f, c):
                        x = _poisson(rng, 3000 * iv)
                        d["np_ecn_marked_roce_packets"] += x
                        d["np_cnp_sent"] += x
                for c in tx:
                    if _pair_hit(f, c):
                        d["rp_cnp_handled"] += _poisson(rng, 3000 * iv)
            # loss, from what the connections carried: the receiver counts the packets after
            # each loss as out of sequence, the sender gets a NAK (packet_seq_err) per loss
            # and waits an ACK timeout per lost tail
            for c in rx:
                lost = _poisson(rng, c.loss * c.sent / MTU) if c.loss else 0
                d["out_of_sequence"] += _poisson(rng, lost * GBN_WINDOW / 2) if lost else 0
            for c in tx:
                if c.loss:
                    d["packet_seq_err"] += _poisson(rng, c.loss * c.sent / MTU)
                    d["local_ack_timeout_err"] += c.tails
            for b0, b1, lk, direction, _ in self.bursts:  # congestion marks ECN, loses nothing
                if b0 <= t < b1 and any(_crosses(c, lk, direction) for c in rx):
                    x = _poisson(rng, 2000 * iv)
                    d["np_ecn_marked_roce_packets"] += x
                    d["np_cnp_sent"] += x
            cum = self.counters[key]
            for name, v in d.items():
                cum[name] += v
            ports.append({
                "dev": nic.dev, "port": 1, "state": "DOWN" if down else "ACTIVE",
                "phys_state": "Disabled" if down else "LinkUp", "rate_gbps": nic.gbps,
                "netdev": nic.netdev, "counters": dict(cum), "deltas": d,
            })
        return ports

    def _events(self, host: str, t0: float, t1: float) -> Iterator[tuple[float, dict[str, Any]]]:
        topo = self.topo.hosts[host]
        for f in self.faults:
            if f.target.partition("/")[0] != host and f.kind not in RANK_KINDS:
                continue
            nic = topo.nic(f.target.partition("/")[2]) if "/" in f.target else None
            starts = t0 <= f.start < t1
            ends = f.end is not None and t0 <= f.end < t1
            if f.kind == "xid" and starts:
                job, r = self.rank_ref(int(f.target))
                if job is None or job.host_of[r] != host:
                    continue
                pci = xid_pci(topo.gpu_pci[r % job.G])
                yield f.start, _event("xid", "critical", {
                    "code": 79, "pci": pci, "pid": job.pids[r], "process": "python3",
                    "text": "GPU has fallen off the bus."},
                    f"NVRM: Xid (PCI:{pci}): 79, pid={job.pids[r]}, name=python3, GPU has fallen off the bus.", pci)
            elif f.kind == "nic-down" and nic and (starts or ends):
                state = "down" if starts else "up"
                ts = f.start if starts else f.end
                yield ts, _event("nic_link", "error" if starts else "info",
                                 {"pci": nic.pci, "netdev": nic.netdev, "state": state},
                                 f"mlx5_core {nic.pci} {nic.netdev}: Link {state}", nic.pci)
                yield ts + 0.05, _event("port_state", "error" if starts else "info", {
                    "dev": nic.dev, "port": 1, "from": "ACTIVE" if starts else "DOWN",
                    "to": "DOWN" if starts else "ACTIVE"}, "", nic.dev)
            elif f.kind == "link-flap" and nic and f.active(t0) and int(t0 - f.start) % 10 == 0:
                yield t0 + 0.1, _event("link_flap", "warning", {
                    "dev": nic.dev, "port": 1, "count": 1, "netdev": nic.netdev}, "", nic.dev)
            elif f.kind == "pfc-storm" and nic and f.active(t0):
                yield t0 + 0.2, _event("pause_storm", "error", {
                    "netdev": nic.netdev, "counter": "tx_pause_storm_error_events",
                    "delta": 1, "dev": nic.dev, "port": 1}, "", nic.netdev)
            elif f.kind == "aer" and nic and f.active(t0) and int(t0 - f.start) % 15 == 0:
                yield t0 + 0.3, _event("pcie_aer", "error", {
                    "pci": nic.pci, "severity": "nonfatal", "port": "0000:3a:00.0",
                    "text": f"pcieport 0000:3a:00.0: AER: Uncorrected (Non-Fatal) error "
                            f"received: {nic.pci}"}, "", nic.pci)
        yield from self._stall_events(host, t0, t0 + self.cfg.interval)

    def _stall_events(self, host: str, t0: float, t1: float) -> Iterator[tuple[float, dict[str, Any]]]:
        """nccl_stall from the plugin of each rank on this host whose op stopped moving for
        stall_event_s (the plugin's own threshold)."""
        for job in self.jobs_on.get(host, []):
            yield from self._job_stalls(job, host, t0, t1)

    def _job_stalls(self, job: Job, host: str, t0: float,
                    t1: float) -> Iterator[tuple[float, dict[str, Any]]]:
        inc = job.current(t0)
        if inc is None or inc.stall_since is None:
            return
        te = inc.stall_since + self.cfg.stall_event_s
        if not t0 <= te < t1:
            return
        first = job.first_rank[host]
        done = math.floor(inc.frozen_at or 0)
        blockers = inc.culprits | set(inc.inside)
        kernel = {r for r, k in inc.inside.items() if k == "kernel-hang"}
        for r in range(first, first + job.G):
            if r in inc.culprits or inc.inside.get(r) == "sigstop":
                continue  # not in the op, or its plugin is silent
            # The proxy states of a stuck pipeline: a dead connection waits on the network;
            # a sender whose receiver does not consume waits for credit; a rank stuck in its
            # kernel waits on its GPU; everyone else starves, waiting for data from upstream
            # with nothing to send.
            waiting = [{"peer": c.dst, "channel": c.channel, "dir": "send",
                        "state": "SendWait" if c.stuck else "SendPeerWait"
                        if c.dst in blockers else "SendGPUWait",
                        "idle_s": self.cfg.stall_event_s} for c in job.send_of[r]]
            waiting += [{"peer": c.src, "channel": c.channel, "dir": "recv",
                         "state": "RecvGPUWait" if r in kernel and not c.stuck else "RecvWait",
                         "idle_s": self.cfg.stall_event_s} for c in job.recv_of[r]]
            seq = done + (r in inc.ahead)
            yield te, _event("nccl_stall", "error", {
                "comm": inc.comm, "rank": r, "nranks": job.nranks, "seq": seq,
                "func": "AllReduce", "age_s": self.cfg.stall_event_s, "waiting": waiting,
                "pid": job.pids[r], "job": job.id, "seq_completed": seq}, "", None)


def _event(type_: str, severity: str, attrs: dict[str, Any], msg: str,
           device: str | None) -> dict[str, Any]:
    """An event body built exactly as the agent builds it."""
    return Event(type_, severity, attrs, msg, device or None).body()


def xid_pci(pci: str) -> str:
    """The NVIDIA driver prints a GPU's PCI address without the function: `0000:3b:00`."""
    return pci.rsplit(".", 1)[0]


# Loss on RoCE (go-back-N): a lost packet makes the receiver drop every later packet of the
# window as out of sequence and NAK; the sender resends from the loss. A lost message tail has
# no later packet to reveal it: the sender waits for its ACK timeout.
MTU = 4096
GBN_WINDOW = 64  # packets in flight resent per loss
MSG_BYTES = 512 << 10  # NCCL chunk: a message whose tail can be lost
ACK_TIMEOUT_S = 1e-3  # adaptive retransmission's first timeout


def _loss(f: Fault, slowdown: float) -> float:
    """A lossy link's packet loss rate: given, or the one that slows a crossing connection by
    `slowdown` (older fault specs)."""
    if "loss" in f.params:
        return float(f.params["loss"])
    return max(0.0, slowdown - 1.0) / GBN_WINDOW


def _loss_slowdown(p: float) -> float:
    """Network time per byte at loss rate p, relative to none (resent windows)."""
    return 1.0 + min(p, 0.5) * GBN_WINDOW


ZERO_PROBE_S = 0.2  # TCP's first zero-window probe (RTO minimum); each next one doubles
ZERO_PROBE_MAX_S = 120.0


def _probed(a: float, b: float) -> bool:
    """Whether a zero-window probe of a sender blocked since time 0 falls in (a, b]."""
    t, gap = ZERO_PROBE_S, ZERO_PROBE_S
    while t <= b:
        if t > a:
            return True
        gap = min(2 * gap, ZERO_PROBE_MAX_S)
        t += gap
    return False


def _crosses(c: Conn, link: str, direction: str | None) -> bool:
    """Whether connection c crosses a leaf-spine fabric link in that direction (up: leaf to
    spine, the first fabric hop of its path; down: spine to leaf, the second)."""
    if link not in c.links:
        return False
    i = c.links.index(link)
    return direction in (None, "both") or (direction == "up") == (i == 1)


def _pair_hit(f: Fault, c: Conn) -> bool:
    return set(f.target.split(",")) == {c.src_host, c.dst_host}


def _poisson(rng: random.Random, lam: float) -> int:
    if lam <= 0:
        return 0
    if lam > 30:
        return max(0, int(round(rng.gauss(lam, math.sqrt(lam)))))
    limit, k, p = math.exp(-lam), 0, rng.random()
    while p > limit:
        k += 1
        p *= rng.random()
    return k


# Measuring probes (aggregator/diagnosis/probes.py): what an agent's datagrams see.
PROBE_PPS = 200.0  # a round's datagrams per second (the agent may send up to 500/s)
PROBE_HOP_MS = 0.1  # per hop one way; the answering router's ICMP generation adds jitter
PROBE_JITTER = 0.3  # lognormal sigma of a probe's RTT (a switch CPU answers, not its ASIC)
BURST_PROBE_LOSS = 1e-3  # another tenant's burst drops best-effort datagrams, per unit of (x-1)
QUEUE_MS = (0.5, 2.0)  # standing queue at a rate-limited egress while traffic crosses it
QUEUE_DUTY = 0.5  # share of the time the job's traffic keeps that queue (it computes too)


class SimMeasurer:
    """Answers C4D's measuring probes in a replay (probes.Measurer) from what the run injected,
    packet by packet: each datagram crosses the leg's directed links out and its answer back;
    a lossy direction drops it with its loss rate (binomial over the datagrams, reply path
    included), another tenant's burst drops a few and queues them, and a slowed direction
    delays it only while the job's traffic queues there (a rate-limited link is slow under
    load, not for a lone probe). A NIC that is down answers nothing; a host that is down has
    no agent to ask."""

    def __init__(self, sim: "Simulator", origin: float) -> None:
        self.sim = sim
        self.origin = origin  # the replay clock at simulated time 0 (lab/evaluate.clock_origin)
        self.due: list[tuple[float, Any, Any]] = []

    def measure(self, leg: Any, count: int, now: float) -> bool:
        from c4.aggregator.diagnosis.probes import LegResult

        sim, t0 = self.sim, now - self.origin
        host, _, dev = leg.src.partition("/")
        nic = sim.topo.hosts[host].nic(dev) if host in sim.topo.hosts else None
        if nic is None or sim._host_down(host, t0):
            return False
        # each round its own draws: a leg's outcome must not depend on which other legs
        # were asked (C4D adding a leg would reshuffle every other leg's losses)
        rng = random.Random(zlib.crc32(f"{sim.cfg.seed}|{leg}|{now:.3f}".encode()))
        fab = f"{nic.leaf}-{leg.via}" if leg.ttl >= 2 else None
        hops = [(fab, "up"), (fab, "down")] if fab in sim.topo.links else []
        used = {(lk, d) for lk, d in hops
                if any(_crosses(c, lk, d) for j in sim.jobs for c in j.conns)}
        rtts: list[float] = []
        for i in range(count):
            t = t0 + i / PROBE_PPS
            if any(f.kind == "nic-down" and f.target == leg.src and f.active(t)
                   for f in sim.faults):
                continue
            keep, rtt = 1.0, 2 * leg.ttl * PROBE_HOP_MS * math.exp(
                rng.gauss(0.0, PROBE_JITTER))
            for lk, d in hops:
                for f in sim.faults:
                    if f.target != lk or not f.active(t) or f.params.get("dir", "both") not in \
                            (d, "both"):
                        continue
                    if f.kind == "lossy-link":
                        keep *= 1.0 - _loss(f, sim.cfg.slowdown)
                    elif f.kind == "slow-fabric" and (lk, d) in used and \
                            rng.random() < QUEUE_DUTY:
                        rtt += rng.uniform(*QUEUE_MS) * (
                            1 - 1 / float(f.params.get("x", sim.cfg.slowdown)))
                for b0, b1, blk, bd, x in sim.bursts:
                    if blk == lk and bd == d and b0 <= t < b1:
                        keep *= 1.0 - BURST_PROBE_LOSS * (x - 1)
                        rtt += rng.uniform(*QUEUE_MS) * (1 - 1 / x)
            if rng.random() < keep:
                rtts.append(rtt)
        rtts.sort()
        q = (lambda p: round(rtts[min(len(rtts) - 1, int(p * len(rtts)))], 4)) if rtts else \
            (lambda p: None)
        self.due.append((now + count / PROBE_PPS, leg,
                         LegResult(count, len(rtts), q(0.5), q(0.9))))
        return True

    def results(self, now: float) -> list[tuple[Any, Any]]:
        out = [(leg, r) for at, leg, r in self.due if at <= now]
        self.due = [d for d in self.due if d[0] > now]
        return out


def simulate(cfg: SimConfig, out: str | Path) -> dict[str, Any]:
    """Run a scenario and write the recording, truth and topology; returns a summary."""
    return Simulator(cfg).run(out)

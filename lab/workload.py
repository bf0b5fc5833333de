"""`c4 lab run`: a data-parallel job whose collective is a ring AllReduce over TCP between
ranks in the lab's host namespaces, reporting through the real c4 NCCL profiler plugin.

Each training step reduces `payload` bytes in `buckets` collectives, each after its share of
`compute` (CPU work, so a starved rank really is late), as DDP reduces a bucket of gradients
once the backward pass has produced it; each collective is split over C channels. Channel c runs its own ring (a different
stride over the ranks, so a rank talks to several peers, as NCCL's channels over several NICs
do) with one TCP connection per hop, 2(n-1) chunk steps of payload/(C n) bytes. Per step and
connection the protocol is NCCL's in miniature:

    receiver: 'C' (a buffer is posted)  ->  sender waits for it       (SendPeerWait)
    sender:   header + chunk            ->  receiver waits for it     (RecvWait / SendWait)
    receiver: 'A' once all bytes are in ->  sender's SendWait ends    (the transport's completion)

and a send of step k waits for the receive of step k-1 (SendGPUWait: the data it forwards).
Only the slow hop shows long SendWait per byte; everyone it delays waits for credit or data.

Source ports are bound before connect: by default the lab picks, per connection, a port the
fabric's ECMP sends over the path the lab's path map records for that NIC pair (so the
aggregator's map is the truth); `c4 lab reconnect --sport` and C4P plans give others. C4P's
ports come from the host agent's planned-ports file (`$C4_TCP_PORTS`, `<run_dir>/tcp-ports`,
the file libc4-connect.so reads): they win over the others, and each rank looks at the file at
every step boundary and asks for a reconnect when its connections are not on the planned
ports. Re-pathing reconnects at a step boundary: `request_reconnect(run_dir, sports)` writes
`control.json`, which rank 0 reads at each step, or a rank bumps the epoch for its plan; the
new epoch travels in the chunk headers of the next AllReduce, so every rank knows it when that
AllReduce ends and all reconnect at the same boundary.
"""
from __future__ import annotations

import faulthandler
import json
import math
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from c4.agent.tcp_ports import planned_ports

from . import profiler as P

HEADER = struct.Struct("<IIQ")  # epoch, channel, op sequence
HELLO = struct.Struct("<III")  # rank, channel, epoch (connector -> acceptor)
STALL_MS = 500  # plugin: report a stalled communicator after this long without progress (a
# flapping link's 1 s down phase stalls the ring ~1.4 s: its stuck connections show only there)
PORTS_ENV = "C4_TCP_PORTS"  # the agent's planned-ports file (agent/tcp_ports.py)


@dataclass
class RankSpec:
    rank: int
    host: str
    addr: str
    port: int
    dev: str


@dataclass
class RunConfig:
    run_id: str
    job: str
    comm_id: int
    ranks: list[RankSpec]
    rings: list[list[int]]  # per channel: the ranks in ring order
    sports: dict[str, int]  # connection id "r<rank>c<channel>" -> source port
    payload: int
    steps: int  # 0: until stopped
    compute_ms: float
    nnodes: int
    buckets: int = 1  # AllReduces per step (DDP's gradient buckets), payload split evenly
    plugin: str = ""

    @property
    def nranks(self) -> int:
        return len(self.ranks)

    def bucket(self) -> int:
        return max(self.payload // self.buckets, 1)

    def chunk(self) -> int:
        return max(self.bucket() // (len(self.rings) * self.nranks), 1)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1))

    @classmethod
    def load(cls, path: Path) -> "RunConfig":
        d = json.loads(path.read_text())
        d["ranks"] = [RankSpec(**r) for r in d["ranks"]]
        return cls(**d)

    def neighbours(self, rank: int, channel: int) -> tuple[int, int]:
        ring = self.rings[channel]
        i = ring.index(rank)
        return ring[(i - 1) % len(ring)], ring[(i + 1) % len(ring)]


def conn_id(rank: int, channel: int) -> str:
    return f"r{rank}c{channel}"


def busbw_mbit(payload: int, seconds: float, nranks: int) -> float:
    """NCCL's bus bandwidth of an AllReduce: algorithm bandwidth x 2(n-1)/n."""
    return payload * 8 / seconds * 2 * (nranks - 1) / nranks / 1e6 if seconds > 0 else 0.0


# ------------------------------------------------------------------------ ring orders


def ring_orders(hosts_by_leaf: list[tuple[str, str]], ranks_per_host: int,
                channels: int) -> list[list[int]]:
    """Rank orders, one per channel. Ranks are numbered host by host in the given order;
    the base ring alternates leaves (every hop crosses the fabric when it can) and channel c
    walks it with its own stride, so channels connect different peers. Strides are chosen
    for the fewest hops within a leaf, then the fewest pairs already connected."""
    leaf_of = [leaf for _, leaf in hosts_by_leaf for _ in range(ranks_per_host)]
    n = len(leaf_of)
    by_leaf: dict[str, list[int]] = {}
    for r, leaf in enumerate(leaf_of):
        by_leaf.setdefault(leaf, []).append(r)
    base = []
    for i in range(max(len(v) for v in by_leaf.values())):
        base += [v[i] for v in by_leaf.values() if i < len(v)]
    if n < 3:
        return [base] * channels
    used: set[frozenset[int]] = set()
    out = []
    strides = [s for s in range(1, n) if math.gcd(s, n) == 1]

    def cost(s: int, used: set[frozenset[int]]) -> tuple[int, int, int]:
        ring = [base[(p * s) % n] for p in range(n)]
        hops = [(ring[i], ring[(i + 1) % n]) for i in range(n)]
        return (sum(leaf_of[a] == leaf_of[b] for a, b in hops),
                sum(frozenset(h) in used for h in hops), s)

    for _ in range(channels):
        s = min(strides, key=lambda x: cost(x, used))
        ring = [base[(p * s) % n] for p in range(n)]
        used |= {frozenset((ring[i], ring[(i + 1) % n])) for i in range(n)}
        out.append(ring)
    return out


# ------------------------------------------------------------------------ the rank


def _recv_exact(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        k = sock.recv_into(view[got:])
        if k == 0:
            raise ConnectionError("peer closed the connection")
        got += k


def _expect(sock: socket.socket, byte: bytes) -> None:
    b = sock.recv(1)
    if b != byte:
        raise ConnectionError(f"protocol: expected {byte!r}, got {b!r}")


class Rank:
    def __init__(self, cfg: RunConfig, rank: int, run_dir: Path) -> None:
        self.cfg = cfg
        self.rank = rank
        self.me = cfg.ranks[rank]
        self.dir = run_dir
        self.C = len(cfg.rings)
        self.n = cfg.nranks
        self.nsteps = 2 * (self.n - 1)
        self.chunk = cfg.chunk()
        self.prof = P.Profiler(cfg.comm_id, self.n, rank, cfg.nnodes, cfg.plugin or None)
        self.epoch = 0  # connections' epoch
        self.known = 0  # newest epoch seen (own control read or headers)
        self.control_mtime = 0.0
        self.ports_file = Path(os.environ[PORTS_ENV]) if os.environ.get(PORTS_ENV) else None
        self.ports_seen: tuple[int, int] | None = None  # (inode, mtime) of the file last read
        self.send: list[socket.socket] = []
        self.recv: list[socket.socket] = []
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((self.me.addr, self.me.port))
        self.listener.listen(64)
        self.data = [bytearray(HEADER.size + self.chunk) for _ in range(self.C)]  # per sender

    # -- connections --------------------------------------------------------------------
    def connect(self, sports: dict[str, int]) -> None:
        accepted: dict[int, socket.socket] = {}
        err: list[BaseException] = []

        def accept() -> None:
            try:
                while len(accepted) < self.C:
                    s, _ = self.listener.accept()
                    hello = bytearray(HELLO.size)
                    _recv_exact(s, memoryview(hello))
                    _, ch, epoch = HELLO.unpack(hello)
                    if epoch == self.epoch:
                        accepted[ch] = s
                    else:
                        s.close()  # a late connection of an older epoch
            except BaseException as exc:
                err.append(exc)

        t = threading.Thread(target=accept, daemon=True)
        t.start()
        self.send = []
        for c, sport in enumerate(self.send_ports(sports)):
            nxt = self.cfg.ranks[self.cfg.neighbours(self.rank, c)[1]]
            self.send.append(self._dial(nxt, sport, c))
        t.join()
        if err:
            raise err[0]
        self.recv = [accepted[c] for c in range(self.C)]
        conns = []
        for c, s in enumerate(self.send):
            (la, lp), (ra, rp) = s.getsockname(), s.getpeername()
            conns.append({"id": conn_id(self.rank, c), "rank": self.rank, "channel": c,
                          "peer": self.cfg.neighbours(self.rank, c)[1], "saddr": la,
                          "sport": lp, "daddr": ra, "dport": rp, "epoch": self.epoch})
        (self.dir / "conns").mkdir(exist_ok=True)
        tmp = self.dir / "conns" / f".r{self.rank}.tmp"
        tmp.write_text(json.dumps(conns))
        os.replace(tmp, self.dir / "conns" / f"r{self.rank}.json")

    def send_ports(self, sports: dict[str, int]) -> list[int]:
        """Each channel's source port: `sports` (the lab's pick or `c4 lab reconnect`) under
        the planned-ports rules for its destination (planned_sports)."""
        peers = [self.cfg.ranks[self.cfg.neighbours(self.rank, c)[1]] for c in range(self.C)]
        own = [sports.get(conn_id(self.rank, c), 0) for c in range(self.C)]
        if self.ports_file is None:
            return own
        path = self.ports_file
        return planned_sports([(p.addr, p.port) for p in peers], own,
                              lambda addr, port: planned_ports(path, addr, port))

    def plan_changed(self) -> bool:
        """At a step boundary: did the planned-ports file change so that a connection of
        this rank is not on its planned port any more?"""
        if self.ports_file is None:
            return False
        try:
            st = self.ports_file.stat()
        except FileNotFoundError:
            return False
        seen = (st.st_ino, st.st_mtime_ns)
        if seen == self.ports_seen:
            return False
        self.ports_seen = seen
        live = [s.getsockname()[1] for s in self.send]
        return self.send_ports(dict(zip((conn_id(self.rank, c) for c in range(self.C)),
                                        live))) != live

    def _dial(self, peer: RankSpec, sport: int, channel: int) -> socket.socket:
        deadline = time.monotonic() + 30
        while True:
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            try:
                s.bind((self.me.addr, sport))  # the planned source port: bind before connect
                s.connect((peer.addr, peer.port))
                s.sendall(HELLO.pack(self.rank, channel, self.epoch))
                return s
            except OSError:
                s.close()
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def close_all(self) -> None:
        # the acceptor closes first, so TIME_WAIT stays off the connector's planned port
        for s in self.recv:
            s.close()
        for s in self.send:
            try:
                s.settimeout(5)
                while s.recv(64):
                    pass
            except OSError:
                pass
            s.close()

    # -- one AllReduce ------------------------------------------------------------------
    def allreduce(self, seq: int) -> None:
        coll = self.prof.coll(seq, self.cfg.bucket() // 4, self.C)
        done = [0] * self.C
        cv = threading.Condition()
        errors: list[BaseException] = []
        threads = []
        for c in range(self.C):
            prev, nxt = self.cfg.neighbours(self.rank, c)
            for fn, peer, is_send in ((self._send_op, nxt, True), (self._recv_op, prev, False)):
                # NCCL posts the proxy ops at enqueue; the proxy thread starts them
                op = self.prof.proxy_op(coll, peer, c, is_send, self.nsteps, self.chunk)
                th = threading.Thread(target=self._guard, args=(fn, errors, c, op, seq, done, cv))
                threads.append(th)
        self.prof.stop(coll)  # "enqueued": completion comes from the proxy ops
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        if errors:
            raise errors[0]

    def _guard(self, fn: Callable[..., None], errors: list[BaseException], *args: Any) -> None:
        try:
            fn(*args)
        except BaseException as exc:
            errors.append(exc)
            for s in self.send + self.recv:  # unblock the other threads: the op is lost
                s.close()
            cv = args[-1]
            with cv:
                cv.notify_all()

    def _send_op(self, c: int, op: int | None, seq: int, done: list[int],
                 cv: threading.Condition) -> None:
        s, prof, data = self.send[c], self.prof, self.data[c]
        view = memoryview(data)
        for k in range(self.nsteps):
            h = prof.step(op, k)
            prof.state(h, P.SEND_GPU_WAIT)
            if k:
                with cv:
                    cv.wait_for(lambda k=k: done[c] >= k or s.fileno() < 0)
            prof.state(h, P.SEND_PEER_WAIT)
            _expect(s, b"C")
            prof.state(h, P.SEND_WAIT, self.chunk)
            HEADER.pack_into(data, 0, self.known, c, seq)
            s.sendall(view)
            _expect(s, b"A")
            prof.stop(h)
        prof.stop(op)

    def _recv_op(self, c: int, op: int | None, seq: int, done: list[int],
                 cv: threading.Condition) -> None:
        s, prof = self.recv[c], self.prof
        buf = bytearray(HEADER.size + self.chunk)
        view = memoryview(buf)
        s.sendall(b"C")
        for k in range(self.nsteps):
            h = prof.step(op, k)
            prof.state(h, P.RECV_WAIT)
            _recv_exact(s, view)
            prof.state(h, P.RECV_FLUSH_WAIT, self.chunk)
            s.sendall(b"AC" if k + 1 < self.nsteps else b"A")
            prof.state(h, P.RECV_GPU_WAIT)
            epoch, ch, oseq = HEADER.unpack_from(buf)
            if ch != c or oseq != seq:
                raise ConnectionError(f"channel {c} op {seq}: got channel {ch} op {oseq}")
            self.known = max(self.known, epoch)
            with cv:
                done[c] = k + 1
                cv.notify_all()
            prof.stop(h)
        prof.stop(op)

    # -- the job ------------------------------------------------------------------------
    def control(self) -> dict[str, Any] | None:
        path = self.dir / "control.json"
        try:
            st = path.stat()
        except FileNotFoundError:
            return None
        if st.st_mtime == self.control_mtime:
            return None
        self.control_mtime = st.st_mtime
        return dict(json.loads(path.read_text()))

    def sports_for(self, epoch: int) -> dict[str, int]:
        sports = dict(self.cfg.sports)
        try:
            ctl = json.loads((self.dir / "control.json").read_text())
        except (FileNotFoundError, ValueError):
            return sports
        sports.update({k: int(v) for k, v in (ctl.get("sports") or {}).items()})
        return sports

    def run(self) -> None:
        self.plan_changed()  # the file as it is now: connect() reads it
        self.connect(self.sports_for(0))
        steps_log = open(self.dir / "steps.jsonl", "a") if self.rank == 0 else None
        step = 0
        while self.cfg.steps == 0 or step < self.cfg.steps:
            t0 = time.monotonic()
            if self.rank == 0:
                ctl = self.control()
                if ctl is not None:
                    self.known = max(self.known, int(ctl.get("epoch", 0)))
            if self.plan_changed():
                self.known = max(self.known, self.epoch + 1)
            comm_s = 0.0
            for b in range(self.cfg.buckets):
                # like DDP's backward pass: a bucket is reduced once its gradients are computed
                compute(self.cfg.compute_ms / 1000 / self.cfg.buckets)
                t1 = time.monotonic()
                self.allreduce(step * self.cfg.buckets + b)
                comm_s += time.monotonic() - t1
            reconnected = False
            if self.known > self.epoch:
                self.close_all()
                self.epoch = self.known
                self.connect(self.sports_for(self.epoch))
                reconnected = True
            if steps_log is not None:
                steps_log.write(json.dumps({
                    "step": step, "t": time.time(), "step_s": round(time.monotonic() - t0, 4),
                    "allreduce_s": round(comm_s, 4),
                    "busbw_mbit": round(busbw_mbit(self.cfg.payload, comm_s, self.n), 2),
                    "epoch": self.epoch, "reconnected": reconnected}) + "\n")
                steps_log.flush()
            step += 1
        self.prof.finalize()
        if steps_log is not None:
            steps_log.write(json.dumps({"done": True, "steps": step, "t": time.time()}) + "\n")
            steps_log.close()


def planned_sports(dests: list[tuple[str, int]], own: list[int],
                   planned: Callable[[str, int], list[int]]) -> list[int]:
    """Source ports for connections to `dests` (in connect order) under planned-ports rules,
    as libc4-connect.so reads them: the rules of a destination are its ports, taken in file
    order by successive connections. A connection whose own port is planned keeps it (no
    needless reconnect); the others take the destination's unused planned ports; one left
    without keeps its own port."""
    rules = {d: planned(*d) for d in set(dests)}
    out = list(own)
    free = {d: [p for p in ports if p not in [own[i] for i, x in enumerate(dests) if x == d]]
            for d, ports in rules.items()}
    for i, d in enumerate(dests):
        if own[i] in rules[d]:
            continue
        if free[d]:
            out[i] = free[d].pop(0)
    return out


def compute(seconds: float) -> None:
    """CPU work for `seconds` of this thread's CPU time: a rank starved of CPU takes longer."""
    end = time.thread_time() + seconds
    x = 0
    while time.thread_time() < end:
        for i in range(2000):
            x ^= i * i


# ------------------------------------------------------------------------ control hooks


def request_reconnect(run_dir: str | os.PathLike[str],
                      sports: dict[str, int] | None = None) -> int:
    """Ask a running job to reconnect at its next step boundary, with `sports` (connection
    id "r<rank>c<channel>" -> source port; missing ids keep their port). Returns the epoch;
    `connections(run_dir)` shows each connection's 5-tuple with the epoch it was made in."""
    d = Path(run_dir)
    path = d / "control.json"
    try:
        old = json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        old = {"epoch": 0, "sports": {}}
    merged = {**old.get("sports", {}), **{k: int(v) for k, v in (sports or {}).items()}}
    # ranks also reconnect for plans (epochs of their own): go past the newest made
    epoch = max([int(old.get("epoch", 0))] + [c["epoch"] for c in connections(d)]) + 1
    new = {"epoch": epoch, "sports": merged, "requested": time.time()}
    tmp = d / ".control.json.tmp"
    tmp.write_text(json.dumps(new))
    os.replace(tmp, path)
    return int(new["epoch"])


def connections(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Every rank's send connections as last made: id, rank, channel, peer, 5-tuple, epoch."""
    out: list[dict[str, Any]] = []
    for p in sorted(Path(run_dir, "conns").glob("r*.json")):
        out += json.loads(p.read_text())
    return sorted(out, key=lambda c: (c["rank"], c["channel"]))


def read_steps(run_dir: str | os.PathLike[str]) -> list[dict[str, Any]]:
    try:
        lines = Path(run_dir, "steps.jsonl").read_text().splitlines()
    except FileNotFoundError:
        return []
    return [json.loads(x) for x in lines if x.strip()]


# ------------------------------------------------------------------------ launching


@dataclass
class Launched:
    run_id: str
    dir: Path
    pids: dict[int, int] = field(default_factory=dict)  # rank -> pid
    hosts: dict[int, str] = field(default_factory=dict)


def rank_env(base: dict[str, str], socket_path: Path, job: str, local_rank: int) -> dict[str, str]:
    env = dict(base)
    # LOCAL_RANK as torchrun sets it: the agent reads it as the rank's device, so diagnosis
    # knows the NIC (rail) a rank's connections leave by (agent/jobs.py)
    env.update(C4_AGENT_SOCKET=str(socket_path), C4_JOB_ID=job, C4_INTERVAL_MS="1000",
               C4_STALL_MS=str(STALL_MS), PYTHONUNBUFFERED="1", LOCAL_RANK=str(local_rank))
    # the host agent's planned TCP ports, beside its plugin socket in its run_dir
    env[PORTS_ENV] = str(socket_path.parent / "tcp-ports")
    return env


def spawn_rank(argv: list[str], env: dict[str, str], ns_enter: Callable[[], None],
               cgroup: str | None, log: Path) -> subprocess.Popen[bytes]:
    """A rank process in its host's namespace and cgroup (joined before exec, so every
    socket it makes is its host's), its own session so the lab can signal it alone."""

    def pre() -> None:
        ns_enter()
        if cgroup:
            with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
                f.write("0")

    with open(log, "ab") as out:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, preexec_fn=pre,
                                start_new_session=True)


def main(argv: list[str]) -> int:
    """`python -m c4.lab.workload rank RUN_DIR RANK`."""
    if len(argv) != 3 or argv[0] != "rank":
        print("usage: python -m c4.lab.workload rank RUN_DIR RANK", file=sys.stderr)
        return 2
    run_dir = Path(argv[1])
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))  # threads blocked in recv
    faulthandler.register(signal.SIGUSR1)  # `kill -USR1 PID`: every thread's stack in the log
    Rank(RunConfig.load(run_dir / "config.json"), int(argv[2]), run_dir).run()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

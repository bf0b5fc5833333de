"""The job model: hosts' NIC inventories, communicators and their ranks, current as comms come
and go. Built only from what each host reports about itself, stamped with the aggregator's
arrival clock; nothing compares timestamps across hosts."""
from __future__ import annotations

from collections import Counter, deque
from functools import lru_cache
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Mapping, Protocol

from c4.core.topology import Topology, TopologyError, endpoint, pair_id

from .localise import (PRIO_ACCESS, PRIO_FABRIC, PRIO_HOST, PRIO_NIC, PRIO_PAIR, Component,
                       directed)
from .stats import median


@dataclass
class HostInfo:
    interval: float = 1.0
    nics: list[str] = field(default_factory=list)  # RDMA devices, rail order when known
    netdev_dev: dict[str, str] = field(default_factory=dict)
    pci_dev: dict[str, str] = field(default_factory=dict)
    gpu_pci: list[str] = field(default_factory=list)


PACE_REPORTS = 9
STOPPED = ("T", "t")  # /proc state of a process stopped by a signal or a tracer
# a job's next checkpoint may last this much longer than the longest pause it recovered from
# (the NCCL and the TCP hang detectors' learned allowance)
PAUSE_MARGIN = 1.5
MARGINAL_REPORTS = 20
LEARNED_REFRESH_S = 5.0  # a learned path (C4P's probes) is looked up again this often
_TOPOLOGY_PATH = object()  # a placed connection's tag: its path is the topology's
Sock = tuple[str, int, str, int]  # a TCP connection as its sender sees it: saddr, sport, daddr, dport


class Placed(Protocol):
    """A connection place() keeps its components on (a Cell, a TcpCell)."""

    path: list[str] | None
    comps: list[Component]
    tag: tuple[Any, ...] | None


class PathSource(Protocol):
    """Paths learned by probing (C4P's path map, aggregator/planner/service.py)."""

    def learned_path(self, src: str, dst: str, now: float) -> tuple[str, ...] | None:
        """The one path the live flows NIC src -> NIC dst take (None: unknown, or several)."""

    def port_path(self, src: str, dst: str, proto: str, dport: int, sport: int,
                  now: float) -> tuple[str, ...] | None:
        """The path one source port of NIC src -> NIC dst takes (`proto` tcp or roce), as
        probes learned it: where a connection on a planned port really runs (None: unknown)."""

    def paths_version(self) -> Hashable:
        """Changes whenever what port_path answers may have (a path learned or forgotten, a
        plan applied)."""

    def request_probe(self, src: str, dst: str, now: float) -> bool:
        """Trace the live flows src -> dst soon, within the prober's rate limits; False when
        no live flow joins them."""


class Rank:
    __slots__ = ("rank", "host", "pid", "dev", "nic", "seen", "listed", "seq_started",
                 "seq_completed", "inflight", "sends", "peers", "ew", "op", "strag", "stall",
                 "fresh", "pace", "period", "gpu_fault", "proc", "usage")

    def __init__(self, rank: int, host: str) -> None:
        self.rank = rank
        self.host = host
        self.pid: int | None = None
        self.dev: int | None = None
        self.nic: str | None = None  # endpoint "host/dev" of the NIC it uses
        self.seen = 0.0  # aggregator clock of its latest fresh summary
        self.listed = 0.0  # ... of its host's latest report listing it (fresh or repeated)
        self.seq_started = 0
        self.seq_completed = 0
        self.inflight: dict[str, Any] | None = None
        self.sends: dict[int, tuple[int, float]] = {}  # peer -> (bytes, net_wait_s), last report
        self.peers: set[int] = set()
        self.ew: float | None = None  # entry wait per op, last report
        self.op: float | None = None  # collective duration per op, last report
        self.strag: deque[bool] = deque()  # straggler pattern seen, per report
        self.stall: dict[str, Any] | None = None  # latest nccl_stall attrs
        self.fresh = False  # a report arrived since the last tick
        self.pace: deque[float] = deque(maxlen=PACE_REPORTS)  # seconds per op, per report
        self.period: float | None = None  # median of pace: a partial interval cannot move it
        self.gpu_fault: float | None = None  # aggregator clock of an Xid that named its GPU
        # (its process's /proc state letter, arrival) from tcp_flows.owners, where its host
        # tracks a TCP socket of it (NCCL's bootstrap, the rendezvous store)
        self.proc: tuple[str, float] | None = None
        # its process's (arrival, CPU seconds, bytes written) from the same owners, first
        # since its last completed collective and latest: whether a rank idle in a stall
        # runs or writes (a checkpoint) over it (hang.py); None while unknown
        self.usage: tuple[tuple[float, float, int, int], tuple[float, float, int]] | None = None


class SlowWindow:
    """How persistently a connection is slow over its last reports: the one rule for the NCCL
    matrix (slow.py) and the TCP detector (tcp.py). Slow in `slow_persist` of the window's
    reports, over a span of at least `slow_hold_s` without a break (a burst of congestion is
    shorter)."""

    __slots__ = ("hist", "streak", "since", "last_slow")
    # A report that is not slow restarts the span: a degraded link slows every report, while
    # two of other tenants' bursts on one link, a report apart, spanned the hold between them
    # (loss.End: low-rate loss is sporadic, an interval without it is no break).
    BREAKS = True

    def __init__(self) -> None:
        self.hist = 0  # bit i: the report i reports ago was slow
        self.streak = 0  # slow reports in the window
        self.since = 0.0  # arrival of the first slow report of the current run
        self.last_slow = 0.0  # ... and of its latest slow report

    def push(self, slow: bool, now: float, mask: int) -> None:
        if slow:
            if not self.hist or (self.BREAKS and not self.hist & 1):
                self.since = now
            self.last_slow = now
        self.hist = ((self.hist << 1) | slow) & mask
        self.streak = self.hist.bit_count()

    def persistent(self, reports: int, hold_s: float) -> bool:
        return self.streak >= reports and self.last_slow - self.since >= hold_s

    def restart(self) -> None:
        """Forget the reports so far (Model.place, when the connection changed path: what it
        measured on the old path is no evidence about the new one)."""
        self.hist = self.streak = 0
        self.since = self.last_slow = 0.0


def ballot(windows: Mapping[Any, SlowWindow], reports: int, hold_s: float,
           doubtful: Callable[[Any], bool], components: Callable[[Any], list[Component] | None],
           ) -> tuple[set[Hashable], dict[Hashable, list[Component]]]:
    """The observations that vote on a fault (slow cells, TCP cells, NIC loss ends): (the
    persistently bad ones, every voter's components). One bad now but not persistently, or
    `doubtful` (elevated below the threshold), is evidence of neither health nor a fault (a
    marginal fault flags only some of its cells) and does not vote; nor does one whose
    components are unknown (None)."""
    bad = {k for k, w in windows.items() if w.persistent(reports, hold_s)}
    if not bad:
        return bad, {}
    cells: dict[Hashable, list[Component]] = {}
    for k, w in windows.items():
        if k not in bad and (w.streak or doubtful(k)):
            continue
        comps = components(k)
        if comps is not None:
            cells[k] = comps
    return bad & cells.keys(), cells


class Cell(SlowWindow):
    """One rank -> peer send connection of a communicator (all channels together)."""

    __slots__ = ("src", "dst", "value", "slow_value", "seen", "path", "comps", "tag", "devs",
                 "share", "units", "first_excess", "hot")

    def __init__(self, src: int, dst: int) -> None:
        super().__init__()
        self.src = src
        self.dst = dst
        self.value = 0.0  # network wait per byte (s/B), last report with data
        self.slow_value = 0.0  # its value in the last report that was slow
        self.seen = -1e18
        self.path: list[str] | None = None
        self.comps: list[Component] = []
        self.tag: tuple[Any, ...] | None = None  # what `path` and `comps` were computed from (place)
        # log(value / what the slow detector expects of it) of its recent reports (marginal
        # slowness)
        self.devs: deque[float] = deque(maxlen=MARGINAL_REPORTS)
        # log of its load share: the most of the communicator's connections per Gbit/s on a
        # link of its path, at the last tick (slow.py); None while its path is unknown
        self.share: float | None = None
        self.units: tuple[list[Component], list[str]] | None = None  # (comps, slow.link_units)
        # how far its devs' median stood above the job's median cell when it first had enough
        # of them (slow.py's marginal test measures slowness that arrived since)
        self.first_excess: float | None = None
        # persistently slow per report since its marginal history was last cleared
        self.hot = False

    def restart(self) -> None:
        super().restart()
        self.rebase()

    def rebase(self) -> None:
        """Restart its marginal history (slow.py): what its reports are judged against changed."""
        self.devs.clear()
        self.first_excess = None


class Comm:
    def __init__(self, comm: str, job: str | None, nranks: int, now: float) -> None:
        self.comm = comm
        self.job = job or f"comm-{comm}"
        self.nranks = nranks
        self.ranks: dict[int, Rank] = {}
        self.cells: dict[tuple[int, int], Cell] = {}
        self.last_seen = now
        self.interval = 1.0
        self.period: float | None = None  # seconds per completed collective (update_pace)
        self.baseline: tuple[float, float] | None = None  # (log s/B center, sigma)
        # where its connections move data at their load shares (slow.py): (log s/B per unit
        # of share: center, sigma)
        self.share: tuple[float, float] | None = None
        # what its slow findings named (slow.py, one fault one incident): incident key ->
        # (the connections, the component ids that explain them, when)
        self.slow_named: dict[str, tuple[list[tuple[int, int]], frozenset[str], float]] = {}
        # (kind, id) -> (first, last) evaluation of its run of marginal findings (slow.py)
        self.marginal_runs: dict[tuple[str, str], tuple[float, float]] = {}

    def hosts(self) -> list[str]:
        return sorted({r.host for r in self.ranks.values()})

    def update_pace(self) -> None:
        """The job's own pace: the median rank's median time between completed collectives."""
        periods = [r.period for r in self.ranks.values() if r.period is not None]
        if periods:
            self.period = median(periods)


class Model:
    def __init__(self, topology: Topology | None) -> None:
        self.topology = topology
        self.hosts: dict[str, HostInfo] = {}
        self.comms: dict[str, Comm] = {}
        self.comm_jobs: Counter[str] = Counter()  # job -> its communicators (plugin jobs)
        self.pids: dict[tuple[str, int], tuple[str, int]] = {}  # (host, pid) -> (comm, rank)
        self.reported: dict[str, float] = {}  # host -> arrival of its latest report
        self.flows: dict[str, dict[str, int]] = {}  # job -> host -> TCP flows tracked there
        self.addrs: dict[str, tuple[str, str | None]] = {}  # IP -> (host, netdev)
        self.max_comms = 50000  # DiagnosisConfig.max_comms
        self.evicted: list[Comm] = []  # dropped at the limit since the last expire()
        self.paths: PathSource | None = None  # learned paths: of ports, of NIC pairs
        self.now = 0.0
        self.learned: dict[tuple[str, str], tuple[tuple[str, ...] | None, float]] = {}
        # (src NIC, dst NIC, dport, sport) -> (its learned path, looked up at, paths_version)
        self.port_paths: dict[tuple[str, str, int, int],
                              tuple[tuple[str, ...] | None, float, Hashable]] = {}
        self.paths_seen: Hashable = None  # paths_version() when the caches were filled
        # the hosts' TCP connections (tcp_flows): host -> sock -> (owner pid, sends bulk
        # data), and each process's: (host, pid) -> socks
        self.socks: dict[str, dict[Sock, tuple[int, bool]]] = {}
        self.pid_socks: dict[tuple[str, int], set[Sock]] = {}
        for th in topology.hosts.values() if topology is not None else ():
            for nic in th.nics:  # sockets' NICs before (or without) the hosts' hellos
                if nic.addr and nic.netdev:
                    self.addrs[nic.addr] = (th.name, nic.netdev)

    # -- hosts ----------------------------------------------------------------------------
    def host(self, name: str) -> HostInfo:
        info = self.hosts.get(name)
        if info is None:
            info = self.hosts[name] = HostInfo()
            th = self.topology.hosts.get(name) if self.topology else None
            if th is not None:
                info.nics = [n.dev for n in th.nics]
                info.netdev_dev = {n.netdev: n.dev for n in th.nics if n.netdev}
                info.pci_dev = {n.pci: n.dev for n in th.nics if n.pci}
                info.gpu_pci = list(th.gpu_pci)
        return info

    def on_hello(self, host: str, body: dict[str, Any]) -> None:
        info = self.host(host)
        info.interval = float(body.get("interval") or info.interval)
        nics: list[tuple[int, int, str]] = []
        for nic in body.get("nics", []):
            rails = [p.get("rail") for p in nic.get("ports", []) if p.get("rail") is not None]
            nics.append((rails[0] if rails else 1 << 20, len(nics), nic["dev"]))
            if nic.get("pci"):  # the agent's own inventory; a topology file may add more
                info.pci_dev.setdefault(nic["pci"], nic["dev"])
            for p in nic.get("ports", []):
                if p.get("netdev"):
                    info.netdev_dev[p["netdev"]] = nic["dev"]
        if nics and not (self.topology and host in self.topology.hosts):
            info.nics = [d for _, _, d in sorted(nics)]
        for nd in body.get("netdevs", []):
            for addr in nd.get("addrs", []):
                self.addrs[bare_addr(addr)] = (host, nd["name"])

    def nic_endpoint(self, host: str, dev: int | None) -> str | None:
        """The NIC a rank on CUDA device `dev` uses: the one on its rail (NCCL picks the
        closest NIC; rail-optimised hosts pair GPU i with NIC i)."""
        info = self.host(host)
        if dev is None or not info.nics:
            return None
        return endpoint(host, info.nics[dev % len(info.nics)])

    def nic_of_netdev(self, host: str, netdev: str | None) -> str | None:
        dev = self.host(host).netdev_dev.get(netdev or "")
        return endpoint(host, dev) if dev else None

    # -- communicators --------------------------------------------------------------------
    def on_comm(self, host: str, s: dict[str, Any], interval: float, now: float) -> tuple[Comm, Rank]:
        comm = self.comms.get(s["comm"])
        if comm is None:
            if len(self.comms) >= self.max_comms:  # a flood of made-up communicators
                oldest = min(self.comms.values(), key=lambda c: c.last_seen)
                self._forget(oldest)
                self.evicted.append(oldest)
            comm = self.comms[s["comm"]] = Comm(s["comm"], s.get("job"), s["nranks"], now)
            self.comm_jobs[comm.job] += 1
        comm.last_seen = now
        comm.interval = interval
        if s.get("job") and comm.job.startswith("comm-"):
            self._uncount(comm)
            comm.job = s["job"]
            self.comm_jobs[comm.job] += 1
        rk = comm.ranks.get(s["rank"])
        if rk is None or rk.host != host:
            rk = comm.ranks[s["rank"]] = Rank(s["rank"], host)
        pid = s.get("pid")
        if pid is not None:
            if rk.pid is not None and rk.pid != pid:
                self.pids.pop((host, rk.pid), None)
            rk.pid = pid
            self.pids[(host, pid)] = (comm.comm, rk.rank)
        if rk.nic is None or s.get("dev") != rk.dev:
            rk.dev = s.get("dev")
            rk.nic = self.nic_endpoint(host, rk.dev)
        inflight = s.get("inflight")
        # The agent repeats a process's last summary until it expires it: an op in flight
        # whose ages did not move is a process that stopped sending (SIGSTOP, a plugin stuck
        # with its process), not a fresh report.
        if not (inflight and rk.inflight == inflight):
            rk.seen = now
        rk.listed = now
        rk.fresh = True
        ops, op_s = 0, 0.0
        for c in s["colls"]:
            ops += c["count"]
            op_s += c["time_s"]
        if ops and interval > 0:
            rk.pace.append(interval / ops)
            rk.period = median(rk.pace)
        rk.seq_started, rk.seq_completed = s["seq_started"], s["seq_completed"]
        rk.inflight = inflight
        if rk.inflight is None:
            rk.stall = None
        sends: dict[int, list[float]] = {}
        peers = set()
        for p in s["peers"]:
            peers.add(p["peer"])
            if p["dir"] == "send":
                acc = sends.setdefault(p["peer"], [0, 0.0])
                acc[0] += p["bytes"]
                acc[1] += p["net_wait_s"]
        rk.peers = peers
        rk.sends = {k: (int(v[0]), v[1]) for k, v in sends.items()}
        eops = s.get("entry_ops") or 0
        rk.ew = s.get("entry_wait_s", 0.0) / eops if eops else None
        rk.op = op_s / ops if ops else None
        return comm, rk

    def components(self, comm: Comm, cell: Cell) -> list[Component] | None:
        """What the connection passes through (localise.py), None while an end is unknown."""
        s, d = comm.ranks.get(cell.src), comm.ranks.get(cell.dst)
        if s is None or d is None:
            return None
        return self.place(cell, s.host, s.nic, d.host, d.nic, self.rank_socks(s, d))

    def place(self, conn: Placed, s_host: str, s_nic: str | None, d_host: str, d_nic: str | None,
              socks: tuple[Sock, ...] = ()) -> list[Component]:
        """A connection's components (kept in its `path`, `comps` and `tag`), recomputed
        when its ends, its sockets or their paths change (a learned path is looked up
        again every LEARNED_REFRESH_S, and at once when C4P's paths change). A connection
        that left a known path (C4P moved it) restarts its slow history: its reports on
        the old path would vote against the new one's links."""
        key = (s_host, s_nic, d_host, d_nic, socks, self._paths_fresh() if socks else None)
        tag = conn.tag
        if tag is not None and tag[0] == key and tag[1] is _TOPOLOGY_PATH:
            return conn.comps
        path, static = self.route(s_host, s_nic, d_host, d_nic, socks)
        if tag is None or tag[0] != key or tag[1] != path:
            moved = tag is not None and conn.path is not None and conn.path != path
            conn.path, conn.comps = self.path_components(s_host, s_nic, d_host, d_nic, path)
            conn.tag = (key, _TOPOLOGY_PATH if static else path)
            if moved and isinstance(conn, SlowWindow):
                conn.restart()
        return conn.comps

    def route(self, s_host: str, s_nic: str | None, d_host: str, d_nic: str | None,
              socks: tuple[Sock, ...] = ()) -> tuple[list[str] | None, bool]:
        """(the fabric path a connection takes, whether the topology alone says so). Each
        socket runs where C4P's map puts its source port (after a plan, the planned port's
        path, not the NIC pair's default one); a socket whose port the map does not know,
        and a connection with no known socket, on the topology's path for the NIC pair, or
        the one learned for the pair where the topology has none. None: unknown, or its
        sockets take different paths (no one path to vote on)."""
        path = self.topology.path(s_host, d_host, _dev(s_nic), _dev(d_nic)) \
            if self.topology is not None else None
        static = path is not None
        if path is None:
            learned = self.learned_path(s_host, s_nic, d_host, d_nic)
            path = list(learned) if learned else None
        if not socks or self.paths is None:
            return path, static
        base = tuple(path) if path else None
        got = {self.sock_path(s_nic, d_nic, k) or base for k in socks}
        one = got.pop() if len(got) == 1 else None
        return (list(one) if one else None), static and one == base

    def sock_path(self, s_nic: str | None, d_nic: str | None,
                  sock: Sock) -> tuple[str, ...] | None:
        """The path C4P's map learned for a TCP socket's source port, between the NICs its
        addresses belong to (else s_nic, d_nic); looked up again every LEARNED_REFRESH_S
        and when C4P's paths change. A path once learned stays while the map forgets it:
        C4P drops the paths through a link with an incident (it plans around them), but the
        connections on them run there until it moves them, and a moved connection is a new
        socket (its new port)."""
        src = self.nic_of_addr(sock[0]) or s_nic
        dst = self.nic_of_addr(sock[2]) or d_nic
        if self.paths is None or not src or not dst:
            return None
        key = (src, dst, sock[3], sock[1])
        got = self.port_paths.get(key)
        if got is None or got[2] != self.paths_seen or self.now - got[1] >= LEARNED_REFRESH_S:
            path = self.paths.port_path(src, dst, "tcp", sock[3], sock[1], self.now)
            got = self.port_paths[key] = (path or (got[0] if got else None), self.now,
                                          self.paths_seen)
        return got[0]

    def _paths_fresh(self) -> Hashable:
        """C4P's paths_version(); a new one makes the learned paths be looked up again."""
        ver = self.paths.paths_version() if self.paths is not None else None
        if ver != self.paths_seen:
            self.paths_seen = ver
            self.learned.clear()
        return ver

    def learned_path(self, s_host: str, s_nic: str | None, d_host: str,
                     d_nic: str | None) -> tuple[str, ...] | None:
        """The path probes learned for a NIC pair the topology has no path for (cached for
        LEARNED_REFRESH_S)."""
        if self.paths is None or not s_nic or not d_nic or (
                self.topology is not None and
                self.topology.path(s_host, d_host, _dev(s_nic), _dev(d_nic)) is not None):
            return None
        got = self.learned.get((s_nic, d_nic))
        if got is None or self.now - got[1] >= LEARNED_REFRESH_S:
            got = self.learned[(s_nic, d_nic)] = (
                self.paths.learned_path(s_nic, d_nic, self.now), self.now)
        return got[0]

    def path_components(self, s_host: str, s_nic: str | None, d_host: str,
                        d_nic: str | None, path: list[str] | None
                        ) -> tuple[list[str] | None, list[Component]]:
        """(path, components) of a connection between two hosts' NICs (endpoints) that
        takes `path` (route)."""
        comps: list[Component] = [("host", s_host, s_host, PRIO_HOST)]
        if d_host != s_host:
            comps.append(("host", d_host, d_host, PRIO_HOST))
        for nic, host in ((s_nic, s_host), (d_nic, d_host)):
            if nic:
                comps.append(("nic", nic, host, PRIO_NIC))
        for link, to in self._directions(path or [], s_host):
            lk = self.topology.links.get(link) if self.topology else None
            prio = PRIO_FABRIC if lk is not None and lk.kind == "fabric" else PRIO_ACCESS
            comps.append(("link", link, None, prio))
            if to:
                comps.append(("link", directed(link, to), None, prio))
        if d_host != s_host:
            comps.append(("link", pair_id(s_host, d_host), None, PRIO_PAIR))
        return path, comps

    def _directions(self, path: list[str], s_host: str) -> list[tuple[str, str | None]]:
        """(link, the node the connection enters through it) along a learned path: a cable
        is a component, and so is each of its directions (a fault is often in one, and the
        other direction's healthy traffic must not clear it). None when the path does not
        start at the sender."""
        links = self.topology.links if self.topology else {}
        first = links.get(path[0]) if path else None
        if first is None:
            return [(lk, None) for lk in path]
        start = first.a if first.a.partition("/")[0] == s_host else first.b
        try:
            hops = self.topology.orient(start, path)  # type: ignore[union-attr]
        except (TopologyError, KeyError):
            return [(lk, None) for lk in path]
        return [(lid, links[lid].b if fwd else links[lid].a) for lid, fwd in hops]

    def _uncount(self, c: Comm) -> None:
        self.comm_jobs[c.job] -= 1
        if self.comm_jobs[c.job] <= 0:
            del self.comm_jobs[c.job]

    def exited(self, rk: Rank) -> bool:
        """Its host reported since without it: the process ended (job killed or crashed)."""
        return self.reported.get(rk.host, 0.0) > rk.listed

    def on_owners(self, host: str, owners: list[dict[str, Any]], now: float) -> None:
        """The state of the processes owning a host's TCP sockets (tcp_flows.owners), kept on
        the ranks they are (a stopped rank is named without waiting for its peers' timers)."""
        for o in owners:
            ref = self.rank_of_pid(host, o["pid"])
            if ref is not None:
                ref[1].proc = (o["state"], now)
                rk, u = ref[1], ref[1].usage
                if "cpu_s" not in o or "written" not in o:
                    rk.usage = None
                elif u is None or u[0][3] != rk.seq_completed or o["cpu_s"] < u[0][1]:
                    rk.usage = ((now, o["cpu_s"], o["written"], rk.seq_completed),
                                (now, o["cpu_s"], o["written"]))
                else:
                    rk.usage = (u[0], (now, o["cpu_s"], o["written"]))

    def on_socks(self, host: str, section: dict[str, Any], bulk_bytes: int) -> None:
        """Which process owns each of a host's TCP connections (tcp_flows), and whether it
        sends bulk data (acked `bulk_bytes` in a report): a rank's connection is placed on
        its own sockets' paths (rank_socks)."""
        table = self.socks.setdefault(host, {})
        listed: set[Sock] = set()
        for f in section.get("flows") or ():
            sock = (bare_addr(f["saddr"]), f["sport"], bare_addr(f["daddr"]), f["dport"])
            listed.add(sock)
            old = table.get(sock)
            pid = f.get("pid")
            if f["closed"] or not pid:
                if old is not None:
                    del table[sock]
                    self._disown(host, sock, old[0])
                continue
            bulk = f["bytes_acked_delta"] >= bulk_bytes
            if old is not None and old[0] == pid:  # the same process's: a bulk sender stays one
                if bulk and not old[1]:
                    table[sock] = (pid, True)
                continue
            if old is not None:  # its port now another process's
                self._disown(host, sock, old[0])
            self.pid_socks.setdefault((host, pid), set()).add(sock)
            table[sock] = (pid, bulk)
        if section.get("refresh") and not section.get("omitted"):
            for sock in [k for k in table if k not in listed]:  # a missed close
                self._disown(host, sock, table.pop(sock)[0])

    def _disown(self, host: str, sock: Sock, pid: int) -> None:
        mine = self.pid_socks.get((host, pid))
        if mine is not None:
            mine.discard(sock)
            if not mine:
                del self.pid_socks[(host, pid)]

    def rank_socks(self, s: Rank, d: Rank) -> tuple[Sock, ...]:
        """The TCP sockets rank s sends its data to rank d on (the lab's ring, NCCL's socket
        transport; none for RDMA): its process's bulk senders to d's host, narrowed to those
        d's process accepted where its host reports them (two ranks on d's host)."""
        if s.pid is None:
            return ()
        table = self.socks.get(s.host, {})
        mine = [k for k in self.pid_socks.get((s.host, s.pid), ())
                if table[k][1] and self.addrs.get(k[2], ("",))[0] == d.host]
        if not mine:
            return ()
        theirs = self.pid_socks.get((d.host, d.pid), set()) if d.pid is not None else set()
        exact = [k for k in mine if (k[2], k[3], k[0], k[1]) in theirs]
        return tuple(sorted(exact or mine))

    def nic_of_addr(self, addr: str) -> str | None:
        """The NIC endpoint whose netdev holds `addr` (a bare address), from the hellos."""
        got = self.addrs.get(addr)
        return self.nic_of_netdev(*got) if got is not None else None

    def sent_to_hosts(self, comm: str, rank: int) -> dict[str, int] | None:
        """Bytes `rank` of `comm` sent over its last report per peer host (each peer rank on
        the host whose report listed it); None when the rank, or a peer it sent to, is not
        placed."""
        c = self.comms.get(comm)
        rk = c.ranks.get(rank) if c else None
        if c is None or rk is None:
            return None
        out: dict[str, int] = {}
        for peer, (sent, _) in rk.sends.items():
            if sent:
                pr = c.ranks.get(peer)
                if pr is None:
                    return None
                out[pr.host] = out.get(pr.host, 0) + sent
        return out

    def rank_of_pid(self, host: str, pid: int | None) -> tuple[Comm, Rank] | None:
        ref = self.pids.get((host, pid)) if pid is not None else None
        comm = self.comms.get(ref[0]) if ref else None
        rk = comm.ranks.get(ref[1]) if comm and ref else None
        return (comm, rk) if comm and rk else None

    def jobs_on_host(self, host: str) -> list[str]:
        jobs = {c.job for c in self.comms.values() if any(r.host == host for r in c.ranks.values())}
        jobs.update(j for j, hs in self.flows.items() if host in hs)
        return sorted(jobs)

    def jobs_using_nic(self, nic: str) -> list[str]:
        """Jobs whose ranks use NIC endpoint `nic`, most ranks first."""
        n: dict[str, int] = {}
        for c in self.comms.values():
            k = sum(1 for r in c.ranks.values() if r.nic == nic)
            if k:
                n[c.job] = n.get(c.job, 0) + k
        return sorted(n, key=lambda j: (-n[j], j))

    def expire(self, now: float, intervals: float, max_s: float = float("inf")) -> list[Comm]:
        """Communicators silent for `intervals` of their reports, or `max_s` seconds on the
        aggregator's clock, whichever comes first (an agent's claimed interval is not trusted
        to keep state alive for hours)."""
        gone = [c for c in self.comms.values()
                if now - c.last_seen > min(intervals * c.interval, max_s)]
        stale = now - 12 * LEARNED_REFRESH_S  # pairs and ports no longer looked up
        for pair in [k for k, v in self.learned.items() if v[1] < stale]:
            del self.learned[pair]
        for port in [k for k, v in self.port_paths.items() if v[1] < stale]:
            del self.port_paths[port]
        for c in gone:
            self._forget(c)
        gone += self.evicted
        self.evicted = []
        return gone

    def _forget(self, c: Comm) -> None:
        del self.comms[c.comm]
        self._uncount(c)
        for r in c.ranks.values():
            if r.pid is not None and self.pids.get((r.host, r.pid)) == (c.comm, r.rank):
                del self.pids[(r.host, r.pid)]

    # -- TCP flows (jobs without the plugin, or its socket transport) ---------------------
    def job_of_flow(self, host: str, f: dict[str, Any]) -> str | None:
        """The one rule for which job a TCP flow belongs to: the job of the communicator whose
        rank owns the flow's process (pid on the same host), else the job id the agent read
        from the owner's environment."""
        ref = self.rank_of_pid(host, f.get("pid"))
        job = ref[0].job if ref else f.get("job")
        return job or None

    def set_flows(self, job: str, host: str, n: int) -> None:
        """The job's TCP flows this host tracks (tcp.py keeps the flow table: agents list only
        the flows that changed, so one report's listing is not the count)."""
        if n > 0:
            self.flows.setdefault(job, {})[host] = n
        elif host in self.flows.get(job, {}):
            del self.flows[job][host]
            if not self.flows[job]:
                del self.flows[job]

    def forget_hosts(self, hosts: set[str]) -> None:
        """The model's per-host state (its communicators' ranks expire with them; a topology
        host's addresses stay, they came from the topology)."""
        for h in hosts:
            self.hosts.pop(h, None)
            self.reported.pop(h, None)
            self.socks.pop(h, None)
        for key in [k for k in self.pid_socks if k[0] in hosts]:
            del self.pid_socks[key]
        fixed = self.topology.hosts if self.topology is not None else {}
        for addr in [a for a, (h, _) in self.addrs.items() if h in hosts and h not in fixed]:
            del self.addrs[addr]


@lru_cache(maxsize=1 << 16)  # a pure function of the few addresses every report repeats
def bare_addr(addr: str) -> str:
    """An address as flows show it: no prefix length, IPv4-mapped IPv6 as IPv4."""
    addr = addr.partition("/")[0]
    return addr[7:] if addr.startswith("::ffff:") and "." in addr else addr


def _dev(nic: str | None) -> str | None:
    return nic.rpartition("/")[2] if nic else None

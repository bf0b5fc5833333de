"""The cluster topology shared by diagnosis (C4D) and planning (C4P).

Hosts carry GPUs and NICs; each NIC port hangs off a leaf by an *access* link; switches form
a Clos fabric by *fabric* links: leaf-spine (two tiers) and, in pod fabrics, spine-core (three
tiers). Dual-plane fabrics are disjoint switch sets (`plane` 0 and 1) with each NIC port in one
of them; a dual-port NIC has two ports (two `Nic` entries with the same `dev`), and a bonded one
(`bond`, RoCE LAG) lets the NIC's hash of the 5-tuple pick the port, so the source port picks
the plane too. Links are undirected, full duplex, named so people can read them:
`node003/mlx5_2-leaf01` (access; `node003/mlx5_2:2-leaf01` for port 2) and `leaf01-spine02`.

`paths` is the learned map endpoint pair -> list of link ids, in production filled from the
path prober's fixed 5-tuple traces and in the simulator from its ECMP choice. An endpoint is a
host name or `host/dev` (a NIC); lookups try the NIC pair first, then the host pair.

File format and checks: docs/planning.md; `c4 topology check FILE` reports each problem with
its line (the builder below collects problems instead of stopping at the first).
"""
from __future__ import annotations

import json
import zlib
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from . import jsonpos

TIERS = ("leaf", "spine", "core")


class TopologyError(ValueError):
    """A topology file or parameter is inconsistent; the message says where."""


@dataclass
class Nic:
    """One NIC port (a dual-port NIC is two of these with the same `dev`)."""

    dev: str
    leaf: str
    rail: int | None = None
    gbps: float = 400.0
    netdev: str | None = None
    pci: str | None = None
    port: int = 1
    plane: int | None = None
    addr: str | None = None  # the port's IP: probes are sent from and to it
    bond: bool = False  # the NIC's ports form one LAG: the 5-tuple hash picks the port

    @property
    def name(self) -> str:
        """`dev` for port 1, `dev:P` otherwise: the endpoint and access-link name part."""
        return self.dev if self.port == 1 else f"{self.dev}:{self.port}"


@dataclass
class Host:
    name: str
    gpus: int
    nics: list[Nic]
    gpu_pci: list[str] = field(default_factory=list)

    def nic(self, dev: str) -> Nic | None:
        return next((n for n in self.nics if n.dev == dev or n.name == dev), None)

    def ports(self, dev: str) -> list[Nic]:
        """The ports a flow from `dev` (or `dev:P`) may leave by."""
        exact = [n for n in self.nics if n.name == dev and ":" in dev]
        if exact:
            return exact
        ports = [n for n in self.nics if n.dev == dev]
        return ports if any(n.bond for n in ports) else ports[:1]


@dataclass
class Switch:
    name: str
    tier: str  # leaf | spine | core
    pod: int | None = None
    plane: int | None = None
    addrs: list[str] = field(default_factory=list)  # loopbacks it may answer probes from


@dataclass(frozen=True)
class Link:
    id: str
    a: str
    b: str
    gbps: float
    kind: str  # access | fabric
    # node -> address of its interface on this link (routers answering from the inbound
    # interface name the exact link)
    addrs: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def other(self, node: str) -> str:
        return self.b if node == self.a else self.a


@dataclass
class Problem:
    level: str  # error | warning
    line: int | None
    msg: str

    def __str__(self) -> str:
        return f"{'line ' + str(self.line) if self.line else '-'}: {self.level}: {self.msg}"


def endpoint(host: str, dev: str | None = None) -> str:
    return f"{host}/{dev}" if dev else host


def access_link_id(host: str, dev: str, leaf: str) -> str:
    return f"{host}/{dev}-{leaf}"


def fabric_link_id(leaf: str, spine: str) -> str:
    return f"{leaf}-{spine}"


def pair_id(a: str, b: str) -> str:
    """Id of the (undirected) path between two hosts, as a suspect names it."""
    x, y = sorted((a, b))
    return f"{x}<->{y}"


def pair_hosts(cid: str) -> list[str]:
    """The two hosts of a `pair_id`; [] for any other id."""
    x, sep, y = cid.partition("<->")
    return [x, y] if sep else []


@dataclass
class Topology:
    hosts: dict[str, Host] = field(default_factory=dict)
    leaves: list[str] = field(default_factory=list)
    spines: list[str] = field(default_factory=list)
    links: dict[str, Link] = field(default_factory=dict)
    paths: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    cores: list[str] = field(default_factory=list)
    switches: dict[str, Switch] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for tier, names in (("leaf", self.leaves), ("spine", self.spines), ("core", self.cores)):
            for n in names:
                self.switches.setdefault(n, Switch(n, tier))
        self._adj: dict[str, list[Link]] | None = None
        self._routes: dict[tuple[str, str], list[tuple[str, ...]]] = {}
        self._addrs: dict[str, tuple[str, str | None]] | None = None
        self._up: dict[str, dict[str, str]] | None = None

    # -- construction -------------------------------------------------------------------
    @classmethod
    def leaf_spine(cls, hosts: int, gpus_per_host: int = 8, leaves: int = 2, spines: int = 2,
                   nics_per_host: int | None = None, nic_gbps: float = 400.0,
                   fabric_gbps: float | None = None, host_prefix: str = "node") -> "Topology":
        """A two-tier fabric: hosts in contiguous blocks per leaf (racks), every leaf to every
        spine. Fabric links default to the leaf's total access bandwidth split over the spines
        (non-blocking)."""
        if hosts < 1 or gpus_per_host < 1 or leaves < 1 or spines < 1:
            raise TopologyError("hosts, gpus_per_host, leaves and spines must be >= 1")
        if leaves > hosts:
            raise TopologyError(f"{leaves} leaves for {hosts} hosts: a leaf would be empty")
        nics = gpus_per_host if nics_per_host is None else nics_per_host
        if nics < 1:
            raise TopologyError("nics_per_host must be >= 1")
        topo = cls()
        hw = max(3, len(str(hosts - 1)))
        for i in range(leaves):
            topo.add_switch(Switch(f"leaf{i:02d}", "leaf"))
        for i in range(spines):
            topo.add_switch(Switch(f"spine{i:02d}", "spine"))
        per_leaf = -(-hosts // leaves)
        for h in range(hosts):
            name = f"{host_prefix}{h:0{hw}d}"
            leaf = topo.leaves[min(h // per_leaf, leaves - 1)]
            nic_list = [Nic(f"mlx5_{i}", leaf, i, nic_gbps, f"eth{i}", f"0000:{0x40 + i:02x}:00.0")
                        for i in range(nics)]
            gpu_pci = [f"0000:{0x18 + i:02x}:00.0" for i in range(gpus_per_host)]
            topo.add_host(Host(name, gpus_per_host, nic_list, gpu_pci))
        topo._uplinks(topo.leaves, lambda _leaf: topo.spines, fabric_gbps)
        return topo

    @classmethod
    def clos(cls, hosts: int, nics_per_host: int = 8, hosts_per_leaf: int = 16,
             spines: int = 8, planes: int = 1, dual_port: bool = False, pods: int = 0,
             cores_per_spine: int = 4, rail_optimized: bool = True, nic_gbps: float = 400.0,
             oversubscription: float = 1.0, host_prefix: str = "node") -> "Topology":
        """A rail-optimised Clos fabric as large clusters build them.

        Hosts come in groups of `hosts_per_leaf`; with `rail_optimized` NIC i of a group's hosts
        attaches to the group's leaf for rail i, else all of a host's NICs share one leaf.
        `planes` > 1 replicates the switches per plane; with `dual_port` every NIC has one
        port per plane (bonded), else NIC i sits in plane i % planes. `pods` > 0 makes three
        tiers: leaves in `pods` pods, `spines` spines per pod, spine j of every pod linked to
        `cores_per_spine` cores of core group j. Uplinks carry the downlink bandwidth divided
        by `oversubscription`."""
        if min(hosts, nics_per_host, hosts_per_leaf, spines, planes) < 1 or pods < 0:
            raise TopologyError("hosts, nics_per_host, hosts_per_leaf, spines, planes >= 1")
        if dual_port and planes != 2:
            raise TopologyError("dual_port needs planes = 2 (one port per plane)")
        topo = cls()
        hw = max(3, len(str(hosts - 1)))
        groups = -(-hosts // hosts_per_leaf)
        per_host_leaves = nics_per_host if rail_optimized else 1
        n_leaves = groups * per_host_leaves
        pods_n = max(pods, 1)
        leaves_per_pod = -(-n_leaves // pods_n)
        port_gbps = nic_gbps / 2 if dual_port else nic_gbps

        def pfx(plane: int) -> str:
            return f"p{plane}." if planes > 1 else ""

        spine_of: dict[tuple[int, int], list[str]] = {}  # (plane, pod) -> spines
        core_of: dict[tuple[int, int], list[str]] = {}  # (plane, spine index) -> cores
        for p in range(planes):
            plane_attr = p if planes > 1 else None
            for i in range(n_leaves):
                topo.add_switch(Switch(f"{pfx(p)}leaf{i:03d}", "leaf",
                                       i // leaves_per_pod if pods else None, plane_attr))
            for pod in range(pods_n):
                for j in range(spines):
                    name = f"{pfx(p)}spine{pod:02d}.{j:02d}" if pods else f"{pfx(p)}spine{j:02d}"
                    topo.add_switch(Switch(name, "spine", pod if pods else None, plane_attr))
                    spine_of.setdefault((p, pod), []).append(name)
            for j in range(spines if pods else 0):
                for c in range(cores_per_spine):
                    name = f"{pfx(p)}core{j:02d}.{c:02d}"
                    topo.add_switch(Switch(name, "core", None, plane_attr))
                    core_of.setdefault((p, j), []).append(name)
        for h in range(hosts):
            name = f"{host_prefix}{h:0{hw}d}"
            g = h // hosts_per_leaf
            nic_list = []
            for i in range(nics_per_host):
                leaf_i = g * per_host_leaves + (i if rail_optimized else 0)
                plane_ports = [(0, 1), (1, 2)] if dual_port else [(i % planes, 1)]
                for plane, port in plane_ports:
                    nic_list.append(Nic(
                        f"mlx5_{i}", f"{pfx(plane)}leaf{leaf_i:03d}", i, port_gbps,
                        f"eth{i}" if port == 1 else f"eth{i}p{port}", f"0000:{0x40 + i:02x}:00.0",
                        port, plane if planes > 1 else None, None, dual_port))
            topo.add_host(Host(name, nics_per_host, nic_list,
                               [f"0000:{0x18 + i:02x}:00.0" for i in range(nics_per_host)]))

        def plane_pod(sw: str) -> tuple[int, int]:
            s = topo.switches[sw]
            return (s.plane or 0, s.pod or 0)

        topo._uplinks(topo.leaves, lambda lf: spine_of[plane_pod(lf)], None, oversubscription)
        if pods:
            topo._uplinks(topo.spines, lambda sp: core_of[(plane_pod(sp)[0],
                                                           spine_of[plane_pod(sp)].index(sp))],
                          None, oversubscription)
        return topo

    def _uplinks(self, lower: list[str], upper: Any, gbps: float | None,
                 oversubscription: float = 1.0) -> None:
        """Link every switch in `lower` to each of `upper(name)`; by default each uplink
        carries the switch's downlink bandwidth / (number of uplinks * oversubscription)."""
        down = {n: 0.0 for n in lower}
        for lk in self.links.values():
            for end, other in ((lk.a, lk.b), (lk.b, lk.a)):
                if end in down and (other not in self.switches or
                                    TIERS.index(self.switches[other].tier) <
                                    TIERS.index(self.switches[end].tier)):
                    down[end] += lk.gbps
        for n in lower:
            ups = upper(n)
            for u in ups:
                bw = gbps if gbps is not None else down[n] / len(ups) / oversubscription
                self.add_link(Link(fabric_link_id(n, u), n, u, bw, "fabric"))

    def add_switch(self, sw: Switch) -> None:
        if sw.name in self.switches:
            raise TopologyError(f"switch {sw.name} defined twice")
        if sw.tier not in TIERS:
            raise TopologyError(f"switch {sw.name}: tier must be one of {', '.join(TIERS)}")
        self.switches[sw.name] = sw
        {"leaf": self.leaves, "spine": self.spines, "core": self.cores}[sw.tier].append(sw.name)
        self._addrs = None

    def add_host(self, host: Host) -> None:
        if host.name in self.hosts:
            raise TopologyError(f"host {host.name} defined twice")
        self.hosts[host.name] = host
        for n in host.nics:
            self.add_link(Link(access_link_id(host.name, n.name, n.leaf),
                               endpoint(host.name, n.name), n.leaf, n.gbps, "access"))

    def add_link(self, link: Link) -> None:
        if link.id in self.links:
            raise TopologyError(f"link {link.id} defined twice")
        self.links[link.id] = link
        self._adj = None
        self._up = None
        self._routes.clear()
        self._addrs = None

    # -- routes -------------------------------------------------------------------------
    def route(self, src_host: str, src_dev: str, dst_host: str, dst_dev: str,
              spine: int) -> list[str]:
        """Links from one NIC to another through spine number `spine` (ignored within a leaf)."""
        a = self._nic(src_host, src_dev)
        b = self._nic(dst_host, dst_dev)
        links = [access_link_id(src_host, a.name, a.leaf)]
        if a.leaf != b.leaf:
            sp = self.spines[spine % len(self.spines)]
            links += [fabric_link_id(a.leaf, sp), fabric_link_id(b.leaf, sp)]
        links.append(access_link_id(dst_host, b.name, b.leaf))
        return links

    def ecmp_route(self, src_host: str, src_dev: str, dst_host: str, dst_dev: str,
                   salt: int = 0) -> list[str]:
        """The route a static hash of the NIC pair picks (stands in for a switch's ECMP hash)."""
        key = f"{salt}|{src_host}/{src_dev}|{dst_host}/{dst_dev}".encode()
        return self.route(src_host, src_dev, dst_host, dst_dev, zlib.crc32(key))

    def adjacency(self) -> dict[str, list[Link]]:
        if self._adj is None:
            adj: dict[str, list[Link]] = {}
            for lk in self.links.values():
                adj.setdefault(lk.a, []).append(lk)
                adj.setdefault(lk.b, []).append(lk)
            self._adj = adj
        return self._adj

    def endpoint_ports(self, ep: str) -> list[tuple[str, Nic]]:
        """(host, port) a flow from endpoint `host/dev` may use: one port, or every port of a
        bonded NIC; `host` alone means every port of the host."""
        host, _, dev = ep.partition("/")
        h = self.hosts.get(host)
        if h is None:
            return []
        return [(host, n) for n in (h.ports(dev) if dev else h.nics)]

    def _ups(self) -> dict[str, dict[str, str]]:
        """switch -> {higher-tier neighbour: link id}: the up half of up-down routing."""
        if self._up is None:
            up: dict[str, dict[str, str]] = {}
            for lk in self.links.values():
                sa, sb = self.switches.get(lk.a), self.switches.get(lk.b)
                if sa is None or sb is None or sa.tier == sb.tier:
                    continue
                lo, hi = (lk.a, lk.b) if TIERS.index(sa.tier) < TIERS.index(sb.tier) else \
                    (lk.b, lk.a)
                up.setdefault(lo, {})[hi] = lk.id
            self._up = up
        return self._up

    def switch_routes(self, a: str, b: str) -> list[tuple[str, ...]]:
        """Every shortest link sequence from switch `a` to switch `b`: the up-down paths a Clos
        fabric's ECMP spreads over (up to the lowest tier where the two meet, then down);
        cached. Fabrics with links inside a tier fall back to a breadth-first search."""
        key = (a, b)
        got = self._routes.get(key)
        if got is not None:
            return got
        if a == b:
            self._routes[key] = [()]
            return [()]
        ups = self._ups()
        # chains[n] = link sequences from the start up to n, grown one tier at a time
        from_a: dict[str, list[tuple[str, ...]]] = {a: [()]}
        from_b: dict[str, list[tuple[str, ...]]] = {b: [()]}
        out: list[tuple[str, ...]] = []
        for _ in range(len(TIERS)):
            meet = set(from_a) & set(from_b)
            if meet:
                out = [pa + tuple(reversed(pb)) for m in sorted(meet)
                       for pa in from_a[m] for pb in from_b[m]]
                break
            from_a = _climb(from_a, ups)
            from_b = _climb(from_b, ups)
            if not from_a or not from_b:
                break
        if not out and any(s.tier == t.tier for lk in self.links.values()
                           for s, t in ((self.switches.get(lk.a), self.switches.get(lk.b)),)
                           if s is not None and t is not None):
            out = self._bfs_routes(a, b)
        self._routes[key] = out
        return out

    def _bfs_routes(self, a: str, b: str) -> list[tuple[str, ...]]:
        adj = self.adjacency()
        dist = {a: 0}
        preds: dict[str, list[Link]] = {a: []}
        q = deque([a])
        while q:
            n = q.popleft()
            if b in dist and dist[n] >= dist[b]:
                break
            for lk in adj.get(n, ()):
                m = lk.other(n)
                if m not in self.switches:
                    continue  # never route through a host
                if m not in dist:
                    dist[m] = dist[n] + 1
                    preds[m] = [lk]
                    q.append(m)
                elif dist[m] == dist[n] + 1:
                    preds[m].append(lk)
        out: list[tuple[str, ...]] = []
        if b in dist:
            def walk(n: str, tail: tuple[str, ...]) -> None:
                if n == a:
                    out.append(tail)
                    return
                for lk in preds[n]:
                    walk(lk.other(n), (lk.id,) + tail)
            walk(b, ())
        return out

    def candidate_paths(self, src: str, dst: str) -> list[tuple[str, ...]]:
        """Every equal-cost path (link ids, in order) from endpoint `src` to endpoint `dst`:
        through each usable port pair (the planes a bonded NIC reaches) and each shortest
        switch route between their leaves."""
        out = []
        for sh, sp in self.endpoint_ports(src):
            for dh, dp in self.endpoint_ports(dst):
                first = access_link_id(sh, sp.name, sp.leaf)
                last = access_link_id(dh, dp.name, dp.leaf)
                for mid in self.switch_routes(sp.leaf, dp.leaf):
                    out.append((first, *mid, last))
        if not out:
            return out
        shortest = min(len(p) for p in out)
        return [p for p in out if len(p) == shortest]

    def ecmp_path(self, src: str, dst: str, proto: str, sport: int, dport: int = 4791,
                  salt: int = 0) -> tuple[str, ...] | None:
        """The path a hash of the 5-tuple picks among the equal-cost paths (the simulator's and
        the benchmark's stand-in for the switches' hashes)."""
        paths = self.candidate_paths(src, dst)
        if not paths:
            return None
        key = f"{salt}|{src}|{dst}|{proto}|{sport}|{dport}".encode()
        return paths[zlib.crc32(key) % len(paths)]

    def orient(self, start: str, path: Iterable[str]) -> list[tuple[str, bool]]:
        """(link id, forward) along `path` from node `start`; forward: traversed a -> b."""
        out, cur = [], start
        for lid in path:
            lk = self.links[lid]
            fwd = lk.a == cur
            if not fwd and lk.b != cur:
                raise TopologyError(f"path from {start}: link {lid} does not touch {cur}")
            out.append((lid, fwd))
            cur = lk.b if fwd else lk.a
        return out

    def resolve_addr(self, addr: str) -> tuple[str, str | None] | None:
        """(node, link id or None) an address belongs to: a link interface names the link."""
        if self._addrs is None:
            idx: dict[str, tuple[str, str | None]] = {}
            for s in self.switches.values():
                for a in s.addrs:
                    idx[a] = (s.name, None)
            for h in self.hosts.values():
                for n in h.nics:
                    if n.addr:
                        idx[n.addr] = (endpoint(h.name, n.name), None)
            for lk in self.links.values():
                for node, a in lk.addrs.items():
                    idx[a] = (node, lk.id)
            self._addrs = idx
        return self._addrs.get(addr)

    def links_from_hops(self, src: str, dst: str,
                        hops: list[str | None]) -> tuple[str, ...] | None:
        """The path a traced 5-tuple took, from the router addresses that answered TTL 1..n
        (the destination answered TTL n+1): one of `candidate_paths(src, dst)`, or None when
        the answers do not pin one down (a silent hop that leaves a choice, an address the
        topology does not know, a route the topology does not have)."""
        want = [self.resolve_addr(a) if a is not None else None for a in hops]
        if any(w is None for w, a in zip(want, hops) if a is not None):
            return None  # an address the topology does not know: another fabric, or stale
        by_node, exact = [], []
        for p in self.candidate_paths(src, dst):
            if len(p) != len(hops) + 1:
                continue
            reached = [(lk.b if fwd else lk.a, lid) for lid, fwd in
                       ((lid, fwd) for lid, fwd in self.orient(self.links[p[0]].a, p))
                       for lk in (self.links[lid],)]
            if all(w is None or w[0] == node for w, (node, _) in zip(want, reached)):
                by_node.append(p)
                # an interface address names the link it arrived by; a router that answers
                # from another interface (the route back) still names itself
                if all(w is None or w[1] is None or w[1] == lid
                       for w, (_, lid) in zip(want, reached)):
                    exact.append(p)
        if len(by_node) == 1:
            return by_node[0]
        return exact[0] if len(exact) == 1 else None

    def set_path(self, src: str, dst: str, links: Iterable[str]) -> None:
        links = list(links)
        unknown = [x for x in links if x not in self.links]
        if unknown:
            raise TopologyError(f"path {src} -> {dst}: unknown link(s) {', '.join(unknown)}")
        self.paths[(src, dst)] = links

    def path(self, src_host: str, dst_host: str, src_dev: str | None = None,
             dst_dev: str | None = None) -> list[str] | None:
        if src_dev and dst_dev:
            p = self.paths.get((endpoint(src_host, src_dev), endpoint(dst_host, dst_dev)))
            if p is not None:
                return p
        return self.paths.get((src_host, dst_host))

    def _nic(self, host: str, dev: str) -> Nic:
        h = self.hosts.get(host)
        nic = h.nic(dev) if h else None
        if nic is None:
            raise TopologyError(f"no NIC {dev} on host {host}")
        return nic

    # -- lookups ------------------------------------------------------------------------
    def nic_by_netdev(self, host: str, netdev: str) -> Nic | None:
        h = self.hosts.get(host)
        return next((n for n in h.nics if n.netdev == netdev), None) if h else None

    def nic_by_addr(self, addr: str) -> tuple[str, Nic] | None:
        node = self.resolve_addr(addr)
        if node is None or "/" not in node[0]:
            return None
        host, _, dev = node[0].partition("/")
        nic = self.hosts[host].nic(dev)
        return (host, nic) if nic else None

    def host_leaf(self, host: str) -> str | None:
        h = self.hosts.get(host)
        return h.nics[0].leaf if h and h.nics else None

    # -- persistence --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        hosts = []
        for h in self.hosts.values():
            nics: list[dict[str, Any]] = []
            for dev in dict.fromkeys(n.dev for n in h.nics):
                ports = [n for n in h.nics if n.dev == dev]
                first = ports[0]
                d: dict[str, Any] = {"dev": dev, "rail": first.rail, "pci": first.pci}
                if len(ports) == 1 and first.port == 1 and first.plane is None and not first.bond:
                    d.update({"leaf": first.leaf, "gbps": first.gbps, "netdev": first.netdev})
                    if first.addr:
                        d["addr"] = first.addr
                else:
                    if first.bond:
                        d["bond"] = True
                    d["ports"] = [{k: v for k, v in (
                        ("port", n.port), ("leaf", n.leaf), ("gbps", n.gbps),
                        ("netdev", n.netdev), ("plane", n.plane), ("addr", n.addr))
                        if v is not None} for n in ports]
                nics.append(d)
            hosts.append({"name": h.name, "gpus": h.gpus, "gpu_pci": h.gpu_pci, "nics": nics})
        out: dict[str, Any] = {"hosts": hosts, "leaves": self.leaves, "spines": self.spines}
        if self.cores:
            out["cores"] = self.cores
        extra = [{k: v for k, v in (("name", s.name), ("tier", s.tier), ("pod", s.pod),
                                    ("plane", s.plane), ("addrs", s.addrs or None))
                  if v is not None}
                 for s in (self.switches[n] for n in (*self.leaves, *self.spines, *self.cores))
                 if s.pod is not None or s.plane is not None
                 or s.addrs]
        if extra:
            out["switches"] = extra
        links = []
        for lk in self.links.values():
            d = {"id": lk.id, "a": lk.a, "b": lk.b, "gbps": lk.gbps, "kind": lk.kind}
            if lk.addrs:
                d["addrs"] = dict(lk.addrs)
            links.append(d)
        out["links"] = links
        out["paths"] = [{"src": s, "dst": d, "links": p} for (s, d), p in self.paths.items()]
        return out

    @classmethod
    def from_dict(cls, data: Any) -> "Topology":
        topo, problems = build(data)
        errors = [p for p in problems if p.level == "error"]
        if errors:
            raise TopologyError("bad topology document: " + "; ".join(
                str(p) for p in errors[:5]) + (f" (+{len(errors) - 5} more)"
                                               if len(errors) > 5 else ""))
        return topo

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> "Topology":
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as exc:
            raise TopologyError(f"{path}: cannot read topology: {exc}") from None
        if not isinstance(data, dict):
            raise TopologyError(f"{path}: topology must be a JSON object")
        return cls.from_dict(data)


# -- building and checking --------------------------------------------------------------------
_HOST_KEYS = {"name", "gpus", "gpu_pci", "nics"}
_NIC_KEYS = {"dev", "leaf", "rail", "gbps", "netdev", "pci", "addr", "ports", "bond", "plane"}
_PORT_KEYS = {"port", "leaf", "gbps", "netdev", "plane", "addr"}
_SWITCH_KEYS = {"name", "tier", "pod", "plane", "addrs"}
_LINK_KEYS = {"id", "a", "b", "gbps", "kind", "addrs"}
_TOP_KEYS = {"hosts", "leaves", "spines", "cores", "switches", "links", "paths"}


class _Checker:
    def __init__(self) -> None:
        self.problems: list[Problem] = []

    def add(self, level: str, obj: Any, key: str | None, msg: str) -> None:
        self.problems.append(Problem(level, jsonpos.line_of(obj, key), msg))

    def err(self, obj: Any, key: str | None, msg: str) -> None:
        self.add("error", obj, key, msg)

    def keys(self, obj: dict[str, Any], allowed: set[str], what: str) -> None:
        for k in obj:
            if k not in allowed:
                self.add("warning", obj, k, f"{what}: unknown field {k!r} (ignored)")

    def get(self, obj: Any, key: str, typ: type | tuple[type, ...], what: str,
            default: Any = ..., positive: bool = False) -> Any:
        """obj[key] checked for type; a problem (and None) when missing or wrong."""
        if not isinstance(obj, dict):
            self.err(obj, None, f"{what}: expected an object")
            return None
        if key not in obj or obj[key] is None:
            if default is ...:
                self.err(obj, None, f"{what}: missing or wrong field {key!r}")
                return None
            return default
        v = obj[key]
        ok = isinstance(v, typ) and not (isinstance(v, bool) and bool not in (
            typ if isinstance(typ, tuple) else (typ,)))
        if not ok:
            self.err(obj, key, f"{what}: missing or wrong field {key!r}: expected "
                     f"{getattr(typ, '__name__', 'a number')}, got {json.dumps(v)[:40]}")
            return None
        if positive and v <= 0:
            self.err(obj, key, f"{what}: {key} must be > 0, got {v}")
            return None
        return v


def build(data: Any) -> tuple[Topology, list[Problem]]:
    """Build a topology from its JSON document, collecting every problem found (with its line
    when `data` came from jsonpos.loads). Problems of level `error` make the document unusable
    for `Topology.from_dict`; warnings do not."""
    c = _Checker()
    topo = Topology()
    if not isinstance(data, dict):
        c.err(data, None, "a topology must be a JSON object")
        return topo, c.problems
    c.keys(data, _TOP_KEYS, "topology")
    num = (int, float)
    # switches: tier lists first, then per-switch attributes
    for tier, key in (("leaf", "leaves"), ("spine", "spines"), ("core", "cores")):
        names = data.get(key, [])
        if not isinstance(names, list):
            c.err(data, key, f"{key}: expected a list of switch names")
            continue
        for n in names:
            if not isinstance(n, str):
                c.err(names, None, f"{key}: switch name {json.dumps(n)[:40]} is not a string")
            elif n in topo.switches:
                c.err(names, None, f"switch {n} listed twice")
            else:
                topo.add_switch(Switch(n, tier))
    for s in data.get("switches", []) or []:
        name = c.get(s, "name", str, "switch")
        if name is None:
            continue
        c.keys(s, _SWITCH_KEYS, f"switch {name}")
        tier = c.get(s, "tier", str, f"switch {name}", None)
        if tier is not None and tier not in TIERS:
            c.err(s, "tier", f"switch {name}: tier must be one of {', '.join(TIERS)}")
            continue
        sw = topo.switches.get(name)
        if sw is None:
            if tier is None:
                c.err(s, None, f"switch {name}: not in leaves/spines/cores, so it needs a tier")
                continue
            topo.add_switch(Switch(name, tier))
            sw = topo.switches[name]
        elif tier is not None and tier != sw.tier:
            c.err(s, "tier", f"switch {name}: tier {tier} but listed as a {sw.tier}")
        sw.pod = c.get(s, "pod", int, f"switch {name}", None)
        sw.plane = c.get(s, "plane", int, f"switch {name}", None)
        sw.addrs = [a for a in c.get(s, "addrs", list, f"switch {name}", []) if isinstance(a, str)]
    # hosts and their NIC ports
    for h in data.get("hosts", []) or []:
        name = c.get(h, "name", str, "host")
        if name is None:
            continue
        c.keys(h, _HOST_KEYS, f"host {name}")
        if name in topo.hosts:
            c.err(h, "name", f"host {name} defined twice")
            continue
        nics: list[Nic] = []
        for n in c.get(h, "nics", list, f"host {name}", []):
            dev = c.get(n, "dev", str, f"host {name} NIC")
            if dev is None:
                continue
            what = f"{name}/{dev}"
            c.keys(n, _NIC_KEYS, what)
            rail = c.get(n, "rail", int, what, None)
            pci = c.get(n, "pci", str, what, None)
            bond = bool(c.get(n, "bond", bool, what, False))
            ports = n.get("ports")
            if ports is None:
                ports = [n]  # the one-port form: the port's fields sit on the NIC
            elif not isinstance(ports, list) or not ports:
                c.err(n, "ports", f"{what}: ports must be a non-empty list")
                continue
            seen: set[int] = set()
            for p in ports:
                if p is not n:
                    c.keys(p, _PORT_KEYS, what)
                pnum = c.get(p, "port", int, what, 1) if p is not n else 1
                if pnum in seen:
                    c.err(p, "port", f"{what}: port {pnum} defined twice")
                    continue
                seen.add(pnum)
                pwhat = what if pnum == 1 else f"{what}:{pnum}"
                leaf = c.get(p, "leaf", str, pwhat)
                gbps = c.get(p, "gbps", num, pwhat, 400.0, positive=True)
                if leaf is None or gbps is None:
                    continue
                plane = c.get(p, "plane", int, pwhat, None)
                sw = topo.switches.get(leaf)
                if sw is None:
                    c.err(p, "leaf", f"{pwhat}: attaches to unknown switch {leaf}")
                    continue
                if sw.tier != "leaf":
                    c.err(p, "leaf", f"{pwhat}: attaches to {leaf}, a {sw.tier}, not a leaf")
                if plane is not None and sw.plane is not None and plane != sw.plane:
                    c.err(p, "plane", f"{pwhat}: plane {plane} but its leaf {leaf} is in plane "
                          f"{sw.plane}")
                nics.append(Nic(dev, leaf, rail, float(gbps), c.get(p, "netdev", str, pwhat,
                                                                    None),
                                pci, pnum, plane if plane is not None else sw.plane,
                                c.get(p, "addr", str, pwhat, None), bond and len(ports) > 1))
        devs = [n.name for n in nics]
        for d in {d for d in devs if devs.count(d) > 1}:
            c.err(h, "nics", f"host {name}: NIC {d} defined twice")
        rails = [n.rail for n in nics if n.port == 1 and n.rail is not None]
        if len(rails) != len(set(rails)):
            c.add("warning", h, "nics", f"host {name}: two NICs on the same rail")
        nics = [n for i, n in enumerate(nics) if n.name not in devs[:i]]
        gpus = c.get(h, "gpus", int, f"host {name}", 0)
        gpu_pci = c.get(h, "gpu_pci", list, f"host {name}", [])
        topo.add_host(Host(name, gpus or 0, nics, [str(x) for x in gpu_pci or []]))
    # links (access links are implied by the hosts)
    for lk in data.get("links", []) or []:
        lid = c.get(lk, "id", str, "link")
        if lid is None:
            continue
        c.keys(lk, _LINK_KEYS, f"link {lid}")
        a, b = c.get(lk, "a", str, f"link {lid}"), c.get(lk, "b", str, f"link {lid}")
        gbps = c.get(lk, "gbps", num, f"link {lid}", positive=True)
        kind = c.get(lk, "kind", str, f"link {lid}", "fabric")
        addrs = c.get(lk, "addrs", dict, f"link {lid}", {})
        if None in (a, b, gbps):
            continue
        if lid in topo.links:
            old = topo.links[lid]
            if old.kind == "access" and kind == "access":
                if addrs:
                    topo.links[lid] = Link(lid, old.a, old.b, old.gbps, "access", dict(addrs))
                continue
            c.err(lk, "id", f"link {lid} defined twice")
            continue
        if kind not in ("access", "fabric"):
            c.err(lk, "kind", f"link {lid}: kind must be access or fabric")
            continue
        if kind == "access":
            c.err(lk, "kind", f"link {lid}: access links come from the hosts' NICs; "
                  "this one matches no NIC port")
            continue
        bad = [x for x in (a, b) if x not in topo.switches]
        if bad:
            c.err(lk, None, f"link {lid}: unknown switch {', '.join(bad)}")
            continue
        if a == b:
            c.err(lk, None, f"link {lid}: both ends are {a}")
            continue
        sa, sb = topo.switches[a], topo.switches[b]
        if sa.plane is not None and sb.plane is not None and sa.plane != sb.plane:
            c.err(lk, None, f"link {lid}: joins plane {sa.plane} ({a}) to plane {sb.plane} ({b})")
        if sa.tier == sb.tier:
            c.add("warning", lk, None, f"link {lid}: joins two {sa.tier} switches; paths "
                  "through it are not up-down routes")
        for node in addrs:
            if node not in (a, b):
                c.err(lk, "addrs", f"link {lid}: addrs names {node}, not one of its ends")
        topo.add_link(Link(lid, a, b, float(gbps), kind,
                           {k: v for k, v in addrs.items() if k in (a, b) and isinstance(v, str)}))
    _check_fabric(topo, data, c)
    for p in data.get("paths", []) or []:
        src, dst = c.get(p, "src", str, "path"), c.get(p, "dst", str, "path")
        links = c.get(p, "links", list, f"path {src} -> {dst}")
        if None in (src, dst, links):
            continue
        unknown = [x for x in links if x not in topo.links]
        if unknown:
            c.err(p, "links", f"path {src} -> {dst}: unknown link(s) {', '.join(map(str, unknown))}")
            continue
        try:
            if links:
                topo.orient(topo.links[links[0]].a, links)
        except TopologyError:
            c.err(p, "links", f"path {src} -> {dst}: links do not form a chain")
            continue
        topo.set_path(src, dst, links)
    return topo, c.problems


def _check_fabric(topo: Topology, data: dict[str, Any], c: _Checker) -> None:
    """Whole-fabric checks: duplicate addresses, leaves without uplinks, oversubscription."""
    seen: dict[str, str] = {}
    for s in topo.switches.values():
        for a in s.addrs:
            if a in seen and seen[a] != s.name:
                c.err(_find(data, "switches", s.name), "addrs",
                      f"address {a} belongs to {seen[a]} and {s.name}: probes cannot tell them "
                      "apart")
            seen[a] = s.name
    for lk in topo.links.values():
        for node, a in lk.addrs.items():
            if a in seen and seen[a] != node:
                c.err(_find(data, "links", lk.id), "addrs",
                      f"address {a} belongs to {seen[a]} and {node}")
            seen[a] = node
    up: dict[str, float] = {n: 0.0 for n in topo.leaves}
    down: dict[str, float] = {n: 0.0 for n in topo.leaves}
    for lk in topo.links.values():
        for end, other in ((lk.a, lk.b), (lk.b, lk.a)):
            if end in up:
                if other in topo.switches and topo.switches[other].tier != "leaf":
                    up[end] += lk.gbps
                elif other not in topo.switches:
                    down[end] += lk.gbps
    if topo.spines or topo.cores:
        for leaf in topo.leaves:
            where = _find(data, "switches", leaf) or data.get("leaves")
            if up[leaf] == 0 and down[leaf] > 0:
                c.add("warning", where, None, f"leaf {leaf} has no uplinks: its hosts reach "
                      "only each other")
            elif up[leaf] and down[leaf] > up[leaf] * 1.001:
                c.add("warning", where, None, f"leaf {leaf} is oversubscribed "
                      f"{down[leaf] / up[leaf]:.2f}:1 ({down[leaf]:g} Gb/s down, "
                      f"{up[leaf]:g} Gb/s up)")


def _find(data: dict[str, Any], key: str, name: str) -> Any:
    for item in data.get(key, []) or []:
        if isinstance(item, dict) and name in (item.get("name"), item.get("id")):
            return item
    return None


def _climb(chains: dict[str, list[tuple[str, ...]]],
           ups: dict[str, dict[str, str]]) -> dict[str, list[tuple[str, ...]]]:
    """Extend every chain one link up."""
    out: dict[str, list[tuple[str, ...]]] = {}
    for n, seqs in chains.items():
        for hi, lid in ups.get(n, {}).items():
            out.setdefault(hi, []).extend(seq + (lid,) for seq in seqs)
    return out


def check_text(text: str) -> tuple[Topology | None, list[Problem]]:
    """`c4 topology check`: every problem of a topology file, with line numbers."""
    try:
        data = jsonpos.loads(text)
    except json.JSONDecodeError as exc:
        return None, [Problem("error", exc.lineno, f"not JSON: {exc.msg}")]
    topo, problems = build(data)
    problems.sort(key=lambda p: (p.line or 0, p.level))
    return topo, problems

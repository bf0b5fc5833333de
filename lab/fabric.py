"""The lab's routed leaf-spine fabric, built in network namespaces from a c4 topology.

`Fabric(topology, prefix)` is the plan (pure: names, addresses, routes), `build()` realises it
with pyroute2 and `sync_routes()` re-applies the routes for a set of links that are down (the
withdrawal a routed fabric does). The recipe is the measured one of design.md:

- one namespace per host, leaf and spine (`<prefix>-<node>`), veth pairs created inside their
  namespaces, MTU 9000 (fewer packets per byte: the CPU is not the bottleneck);
- addresses: a NIC on rail r under leaf L is 10.r.L.(10+k)/32, its gateway 10.r.L.1 (the leaf's
  address on every downlink); fabric link i is a /31 in 172.16.0.0/12; hosts route 10.r/16 via
  their leaf; leaves route each other leaf's 10.r.L/24 over every spine (ECMP), spines route
  10.r.L/24 to leaf L. Routes carry protocol RTPROT_LAB so they can be told from the kernel's;
- routers: forwarding, fib_multipath_hash_policy 3 with fields 0x37 (addresses, protocol,
  ports) and a fixed seed, no rp_filter, no ICMP rate limit, routes over a link without
  carrier ignored;
- hosts: TSO/GSO/GRO off and gso_max_segs 1 (loss is per packet), cubic (bbr hides loss; set
  per route, `congctl cubic`, because a namespace may only pick the algorithms the machine's
  tcp_allowed_congestion_control lists), no slow start after idle, no cached metrics across
  connections;
- fabric links shaped by tbf at the topology's link rate (gbps), so the fabric and not the
  CPU is the bottleneck.
"""
from __future__ import annotations

import errno
import ipaddress
import json
import re
import subprocess
import zlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from pyroute2.ethtool import Ethtool
from pyroute2.netlink.exceptions import NetlinkError

from c4.core.topology import Topology, access_link_id, endpoint, fabric_link_id

from . import netns

RTPROT_LAB = 196  # `ip route` shows it as "proto 196"
MTU = 9000
FABRIC_NET = int(ipaddress.IPv4Address("172.16.0.0"))
HASH_SEED = 0xC4C4
LISTEN_PORT = 30000  # rank i on a host listens on LISTEN_PORT + i
SPORT_RANGE = (40000, 60000)  # source ports the lab picks for its connections
_NAME = re.compile(r"[A-Za-z0-9_.]{1,40}")

ROUTER_SYSCTLS: dict[str, str | int] = {
    "net.ipv4.ip_forward": 1,
    "net.ipv4.fib_multipath_hash_policy": 3,
    "net.ipv4.fib_multipath_hash_fields": "0x0037",
    "net.ipv4.fib_multipath_hash_seed": HASH_SEED,
    "net.ipv4.conf.all.ignore_routes_with_linkdown": 1,
    "net.ipv4.conf.default.ignore_routes_with_linkdown": 1,
}
COMMON_SYSCTLS: dict[str, str | int] = {
    "net.ipv4.conf.all.rp_filter": 0,
    "net.ipv4.conf.default.rp_filter": 0,
    "net.ipv4.icmp_ratelimit": 0,
    "net.ipv4.icmp_errors_use_inbound_ifaddr": 1,
    "net.ipv6.conf.all.disable_ipv6": 1,
    "net.ipv6.conf.default.disable_ipv6": 1,
}
HOST_SYSCTLS: dict[str, str | int] = {
    "net.ipv4.tcp_slow_start_after_idle": 0,     # compute gaps must not reset cwnd
    "net.ipv4.tcp_no_metrics_save": 1,           # a lossy past must not shape a new connection
    "net.ipv4.tcp_tw_reuse": 1,                  # reconnecting on a planned port it just used
}
HOST_OFFLOADS_OFF = ("tx-tcp-segmentation", "tx-generic-segmentation", "rx-gro")


class FabricError(ValueError):
    """The topology cannot be built as a lab (names, sizes); the message says why."""


@dataclass(frozen=True)
class End:
    ns: str
    ifname: str
    addr: str | None = None  # "a.b.c.d/len"


@dataclass(frozen=True)
class Wire:
    """One topology link as a veth pair; `a`/`b` follow the topology link's a/b."""

    link: str
    kind: str  # access | fabric
    a: End
    b: End
    mbit: float | None  # tbf rate on both ends' egress; None: unshaped


@dataclass(frozen=True)
class Route:
    dst: str
    hops: tuple[tuple[str | None, str], ...]  # (gateway or None for on-link, ifname)
    congctl: str | None = None  # TCP congestion control of connections using the route


@dataclass
class NicPlan:
    host: str
    dev: str
    netdev: str
    rail: int
    leaf: str
    addr: str
    gateway: str


@dataclass
class Fabric:
    topology: Topology
    prefix: str
    nics: dict[str, NicPlan] = field(default_factory=dict)  # endpoint host/dev -> plan
    wires: dict[str, Wire] = field(default_factory=dict)  # link id -> wire

    def __post_init__(self) -> None:
        t = self.topology
        if not t.hosts or not t.leaves or not t.spines:
            raise FabricError("the topology needs hosts, leaves and spines")
        for node in [*t.hosts, *t.leaves, *t.spines]:
            if not _NAME.fullmatch(node):
                raise FabricError(f"node name {node!r}: use letters, digits, '_' and '.' "
                                  "(it becomes a namespace name)")
        if len(t.leaves) > 255 or len(t.leaves) * len(t.spines) > 1 << 18:
            raise FabricError("at most 255 leaves and 2^18 fabric links")
        per: dict[tuple[int, str], int] = {}
        downlinks: dict[str, int] = {}
        for host in t.hosts.values():
            for i, nic in enumerate(host.nics):
                if nic.leaf not in t.leaves:
                    raise FabricError(f"{host.name}/{nic.dev}: unknown leaf {nic.leaf}")
                rail = nic.rail if nic.rail is not None else i
                li = t.leaves.index(nic.leaf)
                k = per.get((rail, nic.leaf), 0)
                per[(rail, nic.leaf)] = k + 1
                if rail > 255 or k > 240:
                    raise FabricError(f"{host.name}/{nic.dev}: more than 240 NICs of rail "
                                      f"{rail} under {nic.leaf}")
                netdev = nic.netdev or f"eth{i}"
                plan = NicPlan(host.name, nic.dev, netdev, rail, nic.leaf,
                               f"10.{rail}.{li}.{10 + k}", f"10.{rail}.{li}.1")
                self.nics[endpoint(host.name, nic.dev)] = plan
                d = downlinks.get(nic.leaf, 0)
                downlinks[nic.leaf] = d + 1
                lid = access_link_id(host.name, nic.dev, nic.leaf)
                self.wires[lid] = Wire(lid, "access",
                                       End(self.ns(host.name), netdev, f"{plan.addr}/32"),
                                       End(self.ns(nic.leaf), f"d{d}", f"{plan.gateway}/32"),
                                       None)
        for li, leaf in enumerate(t.leaves):
            for si, spine in enumerate(t.spines):
                lid = fabric_link_id(leaf, spine)
                link = t.links.get(lid)
                if link is None:
                    continue  # a partial fabric: this leaf does not reach this spine
                base = FABRIC_NET + 2 * (li * len(t.spines) + si)
                self.wires[lid] = Wire(
                    lid, "fabric",
                    End(self.ns(leaf), f"s{si}", f"{ipaddress.IPv4Address(base)}/31"),
                    End(self.ns(spine), f"l{li}", f"{ipaddress.IPv4Address(base + 1)}/31"),
                    link.gbps * 1000)

    # -- names ----------------------------------------------------------------------------
    def ns(self, node: str) -> str:
        return f"{self.prefix}-{node}"

    @property
    def namespaces(self) -> list[str]:
        t = self.topology
        return [self.ns(n) for n in [*t.spines, *t.leaves, *t.hosts]]

    def nic_of_addr(self, addr: str) -> NicPlan | None:
        return next((n for n in self.nics.values() if n.addr == addr), None)

    def host_nics(self, host: str) -> list[NicPlan]:
        return [n for n in self.nics.values() if n.host == host]

    # -- routes ---------------------------------------------------------------------------
    def routes(self, down: Iterable[str] = ()) -> dict[str, list[Route]]:
        """The routes of every namespace with the links in `down` withdrawn: what a routed
        fabric converges to (a spine stops announcing a leaf it lost, leaves stop using it)."""
        t = self.topology
        dead = set(down)
        out: dict[str, list[Route]] = {ns: [] for ns in self.namespaces}
        prefixes: dict[str, set[str]] = {leaf: set() for leaf in t.leaves}
        for nic in self.nics.values():
            w = self.wires[access_link_id(nic.host, nic.dev, nic.leaf)]
            prefixes[nic.leaf].add(nic.gateway.rsplit(".", 1)[0] + ".0/24")
            if w.link in dead:
                continue
            out[w.a.ns] += [Route(f"{nic.gateway}/32", ((None, w.a.ifname),)),
                            Route(f"10.{nic.rail}.0.0/16", ((nic.gateway, w.a.ifname),), "cubic")]
            out[w.b.ns].append(Route(f"{nic.addr}/32", ((None, w.b.ifname),)))
        for leaf in t.leaves:
            for spine in t.spines:
                fw = self.wires.get(fabric_link_id(leaf, spine))
                if fw is None or fw.link in dead:
                    continue
                gw = fw.a.addr.split("/")[0]  # type: ignore[union-attr]
                for p in sorted(prefixes[leaf]):
                    out[fw.b.ns].append(Route(p, ((gw, fw.b.ifname),)))
        for leaf in t.leaves:
            for other in t.leaves:
                if other == leaf:
                    continue
                hops = []
                for spine in t.spines:
                    up = self.wires.get(fabric_link_id(leaf, spine))
                    down_ = self.wires.get(fabric_link_id(other, spine))
                    if up is None or down_ is None or up.link in dead or down_.link in dead:
                        continue
                    hops.append((up.b.addr.split("/")[0], up.a.ifname))  # type: ignore[union-attr]
                if hops:
                    for p in sorted(prefixes[other]):
                        out[self.ns(leaf)].append(Route(p, tuple(hops)))
        return out

    # -- realisation ----------------------------------------------------------------------
    def build(self, say: Callable[[str], None] = lambda s: None,
              created: Callable[[str], None] = lambda ns: None) -> None:
        """Create every namespace, link, address, qdisc and route. `created(ns)` is called
        right after each namespace exists, so a crash leaves a record of it."""
        t = self.topology
        for node in [*t.spines, *t.leaves, *t.hosts]:
            ns = self.ns(node)
            netns.create(ns)
            created(ns)
            netns.sysctls(ns, {**COMMON_SYSCTLS,
                               **(HOST_SYSCTLS if node in t.hosts else ROUTER_SYSCTLS)})
        say(f"{len(self.namespaces)} namespaces")
        for w in self.wires.values():
            with netns.open_ns(w.a.ns) as a, netns.open_ns(w.b.ns) as b:
                a.link("add", ifname=w.a.ifname, kind="veth",
                       peer={"ifname": w.b.ifname, "net_ns_fd": str(netns.NETNS_DIR / w.b.ns)})
                for ipr, end in ((a, w.a), (b, w.b)):
                    idx = ipr.link_lookup(ifname=end.ifname)[0]
                    addr, plen = end.addr.split("/")  # type: ignore[union-attr]
                    ipr.addr("add", index=idx, address=addr, prefixlen=int(plen))
                    extra: dict[str, Any] = {"gso_max_segs": 1} if end is w.a and \
                        w.kind == "access" else {}
                    ipr.link("set", index=idx, mtu=MTU, state="up", **extra)
                    if w.mbit is not None:
                        set_rate(ipr, idx, w.mbit)
        say(f"{len(self.wires)} links ({sum(w.kind == 'fabric' for w in self.wires.values())} "
            f"fabric, shaped)")
        for host in t.hosts:
            with netns.inside(self.ns(host)):
                eth = Ethtool()
                try:
                    for nic in self.host_nics(host):
                        f = eth.get_features(nic.netdev)
                        for name in HOST_OFFLOADS_OFF:
                            f.features[name].enable = False
                        eth.set_features(nic.netdev, f)
                finally:
                    eth.close()
        self.sync_routes()
        say("routes (ECMP over the spines)")

    def sync_routes(self, down: Iterable[str] = ()) -> None:
        for ns, routes in self.routes(down).items():
            with netns.open_ns(ns) as ipr:
                sync_ns_routes(ipr, routes)

    # -- paths ----------------------------------------------------------------------------
    def spines_of(self, src: NicPlan, dst: NicPlan, sports: list[int],
                  dport: int) -> list[str | None]:
        """The spine the source leaf's ECMP hash sends each TCP 5-tuple to (None within a
        leaf). The kernel answers for the exact tuple (`ip route get ... ipproto tcp sport
        dport`, one batch per call: pyroute2 cannot send the port attributes)."""
        if src.leaf == dst.leaf:
            return [None] * len(sports)
        return list(self._route_batch(src.leaf, [(src, dst, sp, dport) for sp in sports]))

    def _route_batch(self, leaf: str,
                     tuples: list[tuple[NicPlan, NicPlan, int, int]]) -> list[str]:
        lines = []
        for src, dst, sport, dport in tuples:
            w = self.wires[access_link_id(src.host, src.dev, src.leaf)]
            lines.append(f"route get {dst.addr} from {src.addr} iif {w.b.ifname} ipproto tcp "
                         f"sport {sport} dport {dport}\n")
        out = subprocess.run(["ip", "-n", self.ns(leaf), "-j", "-batch", "-"],
                             input="".join(lines), text=True, capture_output=True,
                             check=True).stdout
        return [self.topology.spines[int(json.loads(line)[0]["dev"][1:])]
                for line in out.splitlines() if line.strip()]

    def spine_of(self, src: NicPlan, dst: NicPlan, sport: int, dport: int) -> str | None:
        return self.spines_of(src, dst, [sport], dport)[0]

    def path(self, src: NicPlan, dst: NicPlan, spine: str | None) -> list[str]:
        links = [access_link_id(src.host, src.dev, src.leaf)]
        if spine is not None:
            links += [fabric_link_id(src.leaf, spine), fabric_link_id(dst.leaf, spine)]
        return links + [access_link_id(dst.host, dst.dev, dst.leaf)]

    def pick_sport(self, src: NicPlan, dst: NicPlan, dport: int, spine: str | None,
                   avoid: set[int], salt: str = "") -> int:
        """A source port whose 5-tuple the fabric's ECMP sends over `spine` (any when None):
        the lab picks ports the way C4P does, so the path map it hands the aggregator is
        the path every connection of that NIC pair really takes."""
        lo, hi = SPORT_RANGE
        start = zlib.crc32(f"{src.addr}>{dst.addr}:{dport}{salt}".encode()) % (hi - lo)
        for first in range(0, hi - lo, 32):
            cands = [lo + (start + i) % (hi - lo) for i in range(first, min(first + 32, hi - lo))]
            cands = [c for c in cands if c not in avoid]
            if spine is None and cands:
                return cands[0]
            for sport, got in zip(cands, self.spines_of(src, dst, cands, dport)):
                if got == spine:
                    return sport
        raise FabricError(f"no source port in {lo}-{hi} reaches {spine} from {src.addr}")

    def path_map(self) -> Topology:
        """The topology with `paths` for every ordered NIC pair of one rail (and the host
        pair, by the first rail): the spine real ECMP picks for the pair's canonical 5-tuple
        (source port from a hash of the pair, destination LISTEN_PORT); and the fabric's
        addresses, so that C4P maps a probe's answers to links (docs/planning.md)."""
        topo = Topology.from_dict(self.topology.to_dict())
        self.addresses(topo)
        topo.paths.clear()
        pairs = [(a, b) for a in self.nics.values() for b in self.nics.values()
                 if a.host != b.host and a.rail == b.rail]
        spine: dict[tuple[str, str], str | None] = {}
        for leaf in self.topology.leaves:
            cross = [(a, b, self.pick_sport(a, b, LISTEN_PORT, None, set()), LISTEN_PORT)
                     for a, b in pairs if a.leaf == leaf and b.leaf != leaf]
            if cross:
                for (a, b, _, _), sp in zip(cross, self._route_batch(leaf, cross)):
                    spine[(a.addr, b.addr)] = sp
        for a, b in pairs:
            links = self.path(a, b, spine.get((a.addr, b.addr)))
            topo.set_path(endpoint(a.host, a.dev), endpoint(b.host, b.dev), links)
            if (a.host, b.host) not in topo.paths:
                topo.set_path(a.host, b.host, links)
        return topo


    def addresses(self, topo: Topology) -> None:
        """Each NIC port's address; each fabric link's two interface addresses (a router
        answers a probe from the interface it arrived on, icmp_errors_use_inbound_ifaddr);
        a leaf's gateway address, the same on all its downlinks, as the leaf's own."""
        for nic in self.nics.values():
            port = topo.hosts[nic.host].nic(nic.dev)
            if port is not None:
                port.addr = nic.addr
            sw = topo.switches[nic.leaf]
            if nic.gateway not in sw.addrs:
                sw.addrs.append(nic.gateway)
        for w in self.wires.values():
            if w.kind == "fabric":
                lk = topo.links[w.link]
                lk.addrs.update({lk.a: str(w.a.addr).split("/")[0],
                                 lk.b: str(w.b.addr).split("/")[0]})
        topo._addrs = None  # resolve_addr's index is stale


def set_rate(ipr: Any, index: int, mbit: float) -> None:
    """tbf at `mbit` on a link's egress: a bucket of a few jumbo frames and 20 ms of queue
    (like a shallow-buffered switch port; TCP fills it and backs off)."""
    rate = int(mbit * 1e6 / 8)  # bytes/s
    ipr.tc("replace", "tbf", index, rate=rate, burst=max(4 * MTU, rate // 250),
           latency="20ms")


def clear_rate(ipr: Any, index: int) -> None:
    try:
        ipr.tc("del", index=index)
    except Exception:  # no root qdisc (never shaped): nothing to remove
        pass


def sync_ns_routes(ipr: Any, routes: list[Route]) -> None:
    """Make the namespace's RTPROT_LAB routes exactly `routes`."""
    idx: dict[str, int] = {}

    def index(name: str) -> int | None:
        if name not in idx:
            found = ipr.link_lookup(ifname=name)
            if not found:
                return None
            idx[name] = found[0]
        return idx[name]

    want = {r.dst: r for r in routes}
    for r in ipr.get_routes(table=254, proto=RTPROT_LAB):
        dst = f"{r.get_attr('RTA_DST')}/{r['dst_len']}"
        if dst not in want:
            try:
                ipr.route("del", dst=dst, table=254, proto=RTPROT_LAB)
            except NetlinkError as exc:
                if exc.code != errno.ESRCH:  # gone with its link meanwhile
                    raise
    for r in routes:
        hops = [(gw, index(dev)) for gw, dev in r.hops]
        hops = [(gw, i) for gw, i in hops if i is not None]
        if not hops:
            continue
        if len(hops) == 1:
            gw, oif = hops[0]
            kw: dict[str, Any] = {"gateway": gw} if gw else {"scope": 253}
            if r.congctl:
                kw["metrics"] = {"RTAX_CC_ALGO": r.congctl}
            ipr.route("replace", dst=r.dst, oif=oif, proto=RTPROT_LAB, **kw)
        else:
            ipr.route("replace", dst=r.dst, proto=RTPROT_LAB,
                      multipath=[{"gateway": gw, "oif": oif} for gw, oif in hops])

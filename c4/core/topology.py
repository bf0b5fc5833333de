"""The cluster topology shared by diagnosis (C4D) and planning (C4P).

Hosts carry GPUs and NICs (one NIC per rail); each NIC hangs off a leaf by an *access* link;
leaves connect to every spine by *fabric* links. Links are undirected and named so people can
read them: `node003/mlx5_2-leaf01` (access) and `leaf01-spine02` (fabric).

`paths` is the learned map endpoint pair -> list of link ids, in production filled from the
path prober's fixed 5-tuple traces and in the simulator from its ECMP choice. An endpoint is a
host name or `host/dev` (a NIC); lookups try the NIC pair first, then the host pair.
"""
from __future__ import annotations

import json
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable


class TopologyError(ValueError):
    """A topology file or parameter is inconsistent; the message says where."""


@dataclass
class Nic:
    dev: str
    leaf: str
    rail: int | None = None
    gbps: float = 400.0
    netdev: str | None = None
    pci: str | None = None


@dataclass
class Host:
    name: str
    gpus: int
    nics: list[Nic]
    gpu_pci: list[str] = field(default_factory=list)

    def nic(self, dev: str) -> Nic | None:
        return next((n for n in self.nics if n.dev == dev), None)


@dataclass(frozen=True)
class Link:
    id: str
    a: str
    b: str
    gbps: float
    kind: str  # access | fabric


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


@dataclass
class Topology:
    hosts: dict[str, Host] = field(default_factory=dict)
    leaves: list[str] = field(default_factory=list)
    spines: list[str] = field(default_factory=list)
    links: dict[str, Link] = field(default_factory=dict)
    paths: dict[tuple[str, str], list[str]] = field(default_factory=dict)

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
        topo.leaves = [f"leaf{i:02d}" for i in range(leaves)]
        topo.spines = [f"spine{i:02d}" for i in range(spines)]
        per_leaf = -(-hosts // leaves)
        for h in range(hosts):
            name = f"{host_prefix}{h:0{hw}d}"
            leaf = topo.leaves[min(h // per_leaf, leaves - 1)]
            nic_list = [Nic(f"mlx5_{i}", leaf, i, nic_gbps, f"eth{i}", f"0000:{0x40 + i:02x}:00.0")
                        for i in range(nics)]
            gpu_pci = [f"0000:{0x18 + i:02x}:00.0" for i in range(gpus_per_host)]
            topo.add_host(Host(name, gpus_per_host, nic_list, gpu_pci))
        leaf_bw = {lf: 0.0 for lf in topo.leaves}
        for host in topo.hosts.values():
            for n in host.nics:
                leaf_bw[n.leaf] += n.gbps
        for leaf in topo.leaves:
            for spine in topo.spines:
                bw = fabric_gbps if fabric_gbps is not None else leaf_bw[leaf] / spines
                topo.add_link(Link(fabric_link_id(leaf, spine), leaf, spine, bw, "fabric"))
        return topo

    def add_host(self, host: Host) -> None:
        if host.name in self.hosts:
            raise TopologyError(f"host {host.name} defined twice")
        self.hosts[host.name] = host
        for n in host.nics:
            self.add_link(Link(access_link_id(host.name, n.dev, n.leaf), endpoint(host.name, n.dev),
                               n.leaf, n.gbps, "access"))

    def add_link(self, link: Link) -> None:
        if link.id in self.links:
            raise TopologyError(f"link {link.id} defined twice")
        self.links[link.id] = link

    # -- routes -------------------------------------------------------------------------
    def route(self, src_host: str, src_dev: str, dst_host: str, dst_dev: str,
              spine: int) -> list[str]:
        """Links from one NIC to another through spine number `spine` (ignored within a leaf)."""
        a = self._nic(src_host, src_dev)
        b = self._nic(dst_host, dst_dev)
        links = [access_link_id(src_host, src_dev, a.leaf)]
        if a.leaf != b.leaf:
            sp = self.spines[spine % len(self.spines)]
            links += [fabric_link_id(a.leaf, sp), fabric_link_id(b.leaf, sp)]
        links.append(access_link_id(dst_host, dst_dev, b.leaf))
        return links

    def ecmp_route(self, src_host: str, src_dev: str, dst_host: str, dst_dev: str,
                   salt: int = 0) -> list[str]:
        """The route a static hash of the NIC pair picks (stands in for a switch's ECMP hash)."""
        key = f"{salt}|{src_host}/{src_dev}|{dst_host}/{dst_dev}".encode()
        return self.route(src_host, src_dev, dst_host, dst_dev, zlib.crc32(key))

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

    def host_leaf(self, host: str) -> str | None:
        h = self.hosts.get(host)
        return h.nics[0].leaf if h and h.nics else None

    # -- persistence --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "hosts": [{"name": h.name, "gpus": h.gpus, "gpu_pci": h.gpu_pci,
                       "nics": [{"dev": n.dev, "leaf": n.leaf, "rail": n.rail, "gbps": n.gbps,
                                 "netdev": n.netdev, "pci": n.pci} for n in h.nics]}
                      for h in self.hosts.values()],
            "leaves": self.leaves,
            "spines": self.spines,
            "links": [{"id": lk.id, "a": lk.a, "b": lk.b, "gbps": lk.gbps, "kind": lk.kind}
                      for lk in self.links.values()],
            "paths": [{"src": s, "dst": d, "links": p} for (s, d), p in self.paths.items()],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Topology":
        topo = cls(leaves=list(data.get("leaves", [])), spines=list(data.get("spines", [])))
        try:
            for h in data.get("hosts", []):
                nics = [Nic(n["dev"], n["leaf"], n.get("rail"), float(n.get("gbps", 400.0)),
                            n.get("netdev"), n.get("pci")) for n in h.get("nics", [])]
                topo.add_host(Host(h["name"], int(h.get("gpus", 0)), nics,
                                   list(h.get("gpu_pci", []))))
            for lk in data.get("links", []):
                if lk["id"] in topo.links:
                    continue  # access links are implied by the hosts
                topo.add_link(Link(lk["id"], lk["a"], lk["b"], float(lk["gbps"]),
                                   lk.get("kind", "fabric")))
            for p in data.get("paths", []):
                topo.set_path(p["src"], p["dst"], p["links"])
        except (KeyError, TypeError) as exc:
            raise TopologyError(f"bad topology document: missing or wrong field {exc}") from None
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

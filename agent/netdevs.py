"""The host's network interfaces for `hello.netdevs`: names, MAC, MTU and IP addresses, so the
aggregator can map a TCP flow's address to its host and interface (diagnosis of jobs without
the plugin names the NIC from this)."""
from __future__ import annotations

import socket
from typing import Any

import psutil

from c4.core.wire.kinds import HELLO

_LIMIT = HELLO.optional["netdevs"].max_len  # type: ignore[attr-defined]
_ADDRS = HELLO.optional["netdevs"].item.optional["addrs"].max_len  # type: ignore[attr-defined]


def netdevs() -> list[dict[str, Any]]:
    stats = psutil.net_if_stats()
    out: list[dict[str, Any]] = []
    for name, addrs in sorted(psutil.net_if_addrs().items()):
        if name == "lo":
            continue  # loopback carries no fabric traffic
        nd: dict[str, Any] = {"name": name, "addrs": []}
        for a in addrs:
            if a.family == psutil.AF_LINK and a.address:
                nd["mac"] = a.address
            elif a.family in (socket.AF_INET, socket.AF_INET6) and len(nd["addrs"]) < _ADDRS:
                nd["addrs"].append(a.address.split("%", 1)[0])  # drop the IPv6 zone index
        if name in stats:
            nd["mtu"] = stats[name].mtu
        out.append(nd)
    return out[:_LIMIT]

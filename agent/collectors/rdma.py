"""`rdma` collector: per-port InfiniBand/RoCE counters from sysfs, with deltas and rates,
port state changes and link flaps (docs/collectors.md#collectors-rdma-pfc-kmsg).

A host without /sys/class/infiniband (RDMA driver not loaded) still starts and reports an
empty `ports` list: a GPU host whose NIC driver is missing must keep reporting, and the
aggregator sees the missing ports against the host's expected inventory.
"""
from __future__ import annotations

from typing import Any, Mapping

from c4.core.catalog import COUNTER_SCALE
from c4.core.wire.kinds import INV_NIC

from .. import rdma_sysfs as sysfs
from ..deltas import Change, CounterTracker
from .base import Collector, Context, Event, Sample
from .options import check_keys, get_int_map

BYTE_RATES: dict[str, str] = {"port_xmit_data": "port_xmit_bytes",
                              "port_rcv_data": "port_rcv_bytes"}

PortKey = tuple[str, int]


class RdmaCollector(Collector):
    name = "rdma"

    def __init__(self, ctx: Context, options: Mapping[str, Any]) -> None:
        super().__init__(ctx, options)
        check_keys(self.name, options, ("rails",))
        self.rails = get_int_map(self.name, options, "rails", 0, 1023)
        self._tracker: CounterTracker[tuple[str, int]] = CounterTracker()
        self._states: dict[PortKey, str] = {}
        self._collected = False

    def start(self) -> None:
        if not (self.ctx.sysfs_root / sysfs.IB_CLASS).is_dir():
            self.ctx.log.info("rdma: no %s; reporting no RDMA ports",
                              self.ctx.sysfs_root / sysfs.IB_CLASS)

    def collect(self, now: float) -> Sample:
        ports: list[dict[str, Any]] = []
        events: list[Event] = []
        seen: set[PortKey] = set()
        for dev_dir in sysfs.list_devices(self.ctx.sysfs_root):
            pci = sysfs.pci_address(dev_dir)
            for ref in sysfs.list_ports(dev_dir):
                key = (ref.dev, ref.port)
                seen.add(key)
                status = sysfs.read_port_status(ref)
                values, unreadable = sysfs.read_counters(ref.path)
                change = self._tracker.update(key, now, values)
                ports.append(_port_entry(ref, status, pci, values, unreadable, change))
                events.extend(self._port_events(ref, status, change))
        for dev, port in sorted(self._tracker.retain(seen)):
            self._states.pop((dev, port), None)
            events.append(Event("port_removed", "warning", {"dev": dev, "port": port},
                                f"{dev} port {port} disappeared", device=dev))
        self._collected = True
        return Sample({"ports": ports}, events)

    def _port_events(self, ref: sysfs.PortRef, status: sysfs.PortStatus,
                     change: Change | None) -> list[Event]:
        events = []
        key = (ref.dev, ref.port)
        before = self._states.get(key)
        if status.state != sysfs.UNKNOWN_STATE:  # an unreadable state file is not a change
            self._states[key] = status.state
        if before is None and self._collected:
            events.append(Event("port_added", "info",
                                {"dev": ref.dev, "port": ref.port, "state": status.state},
                                f"{ref.dev} port {ref.port} appeared ({status.state})",
                                device=ref.dev))
        elif before is not None and status.state not in (before, sysfs.UNKNOWN_STATE):
            severity = ("info" if status.state == "ACTIVE"
                        else "error" if before == "ACTIVE" else "warning")
            events.append(Event("port_state", severity,
                                {"dev": ref.dev, "port": ref.port, "from": before,
                                 "to": status.state},
                                f"{ref.dev} port {ref.port}: {before} -> {status.state}",
                                device=ref.dev))
        flaps = change.deltas.get("link_downed", 0) if change else 0
        if flaps > 0:
            events.append(Event("link_flap", "warning",
                                {"dev": ref.dev, "port": ref.port, "count": flaps,
                                 "netdev": status.netdev},
                                f"{ref.dev} port {ref.port} link went down {flaps} time(s)",
                                device=ref.dev))
        return events

    def inventory(self) -> dict[str, Any]:
        nics = []
        truncated = 0
        for dev_dir in sysfs.list_devices(self.ctx.sysfs_root):
            info = sysfs.read_device(dev_dir)
            nic: dict[str, Any] = {"dev": info.dev, "ports": [], "pci": info.pci}
            for name in ("node_guid", "fw_ver", "board_id", "hca_type"):
                value = getattr(info, name)
                if value is None:
                    continue
                # Descriptive text only: one over-long field (procfs' hfi1 board_id is 72
                # characters) is cut, counted, and never costs the whole hello.
                limit = INV_NIC.optional[name].max_len  # type: ignore[attr-defined]
                if len(value) > limit:
                    truncated += 1
                    self.ctx.log.warning("rdma: %s %s is %d characters; sent cut to %d",
                                         info.dev, name, len(value), limit)
                    value = value[:limit]
                nic[name] = value
            for ref in info.ports:
                status = sysfs.read_port_status(ref)
                port: dict[str, Any] = {
                    "port": ref.port, "state": status.state, "netdev": status.netdev,
                    "gids": sysfs.read_gids(ref.path),
                    "rail": self.rails.get(info.dev),
                }
                if status.link_layer is not None:
                    port["link_layer"] = status.link_layer
                if status.rate_gbps is not None:
                    port["rate_gbps"] = status.rate_gbps
                nic["ports"].append(port)
            nics.append(nic)
        return {"nics": nics, "inventory_truncated": truncated} if truncated else {"nics": nics}


def _port_entry(ref: sysfs.PortRef, status: sysfs.PortStatus, pci: str | None,
                values: dict[str, int], unreadable: list[str],
                change: Change | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"dev": ref.dev, "port": ref.port, "state": status.state,
                             "counters": values, "netdev": status.netdev, "pci": pci}
    for name in ("phys_state", "rate_gbps", "link_layer"):
        if getattr(status, name) is not None:
            entry[name] = getattr(status, name)
    if unreadable:
        entry["unreadable"] = unreadable
    if change is not None:
        rates = dict(change.rates)
        for words, byte_name in BYTE_RATES.items():
            if words in rates:
                rates[byte_name] = rates[words] * COUNTER_SCALE[words]
        entry.update(deltas=change.deltas, rates=rates, resets=change.resets)
    return entry

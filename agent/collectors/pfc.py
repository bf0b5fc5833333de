"""`pfc` collector: PFC pause counters of each RoCE port's netdev from ethtool statistics, with
deltas, rates and pause-storm events (docs/collectors.md#collectors-rdma-pfc-kmsg).

The netdevs are the Ethernet ports of /sys/class/infiniband (or the `netdevs` option). A
netdev whose statistics cannot be read is listed in the section with the reason, logged once
per distinct reason, and retried every interval (a driver reload brings it back).
"""
from __future__ import annotations

import re
from typing import Any, Callable, Mapping

from .. import ethtool, rdma_sysfs as sysfs
from ..deltas import CounterTracker
from .base import Context, Collector, Event, OptionError, Sample
from .options import check_keys, get_str_list

StatsReader = Callable[[str], Mapping[str, int]]

# Pause counters as mlx5 (en_stats.c) names them; other drivers use subsets of these names.
PAUSE_STAT = re.compile(
    r"(rx|tx)_(prio[0-7]|global)_pause(_duration|_transition)?"
    r"|tx_pause_storm_(warning|error)_events"
    r"|(rx|tx)_pause_ctrl_phy")
# counter -> (event type, severity). mlx5 counts a storm when the NIC has been unable to send
# for longer than the device-stall watermarks (minor: warning, critical: error).
STORM_EVENTS: dict[str, tuple[str, str]] = {
    "tx_pause_storm_error_events": ("pause_storm", "error"),
    "tx_pause_storm_warning_events": ("pause_storm_warning", "warning"),
}

Target = tuple[str, str | None, int | None]  # netdev, RDMA device, port


class PfcCollector(Collector):
    name = "pfc"

    def __init__(self, ctx: Context, options: Mapping[str, Any],
                 stats_reader: StatsReader | None = None) -> None:
        super().__init__(ctx, options)
        check_keys(self.name, options, ("netdevs",))
        self.netdevs = get_str_list(self.name, options, "netdevs")
        for n in self.netdevs or ():
            if sysfs.valid_name(n) is None or len(n.encode()) >= ethtool.IFNAMSIZ:
                raise OptionError(f"collectors.pfc.netdevs: {n!r} is not an interface name")
        self._read = stats_reader or ethtool.read_stats
        self._tracker: CounterTracker[str] = CounterTracker()
        self._failing: dict[str, str] = {}

    def targets(self) -> list[Target]:
        """Explicit netdevs, else the netdev of every non-InfiniBand RDMA port (once each:
        the ports of a bonded device share one netdev)."""
        if self.netdevs is not None:
            return [(n, None, None) for n in self.netdevs]
        out: list[Target] = []
        seen: set[str] = set()
        for ref in sysfs.all_ports(self.ctx.sysfs_root):
            link_layer = sysfs.read_text(ref.path / "link_layer")
            if link_layer == "InfiniBand":
                continue  # PFC is an Ethernet mechanism
            netdev = sysfs.port_netdev(ref, link_layer)
            if netdev is not None and netdev not in seen:
                seen.add(netdev)
                out.append((netdev, ref.dev, ref.port))
        return out

    def collect(self, now: float) -> Sample:
        entries: list[dict[str, Any]] = []
        events: list[Event] = []
        targets = self.targets()
        for netdev, dev, port in targets:
            stats = self._stats(netdev)
            if stats is None:
                continue
            counters = {k: v for k, v in stats.items()
                        if PAUSE_STAT.fullmatch(k) and 0 <= v <= sysfs.U64_MAX}
            entry: dict[str, Any] = {"netdev": netdev, "counters": counters}
            if dev is not None:
                entry.update(dev=dev, port=port)
            change = self._tracker.update(netdev, now, counters)
            if change is not None:
                entry.update(deltas=change.deltas, rates=change.rates, resets=change.resets)
                for counter, (etype, severity) in STORM_EVENTS.items():
                    delta = change.deltas.get(counter, 0)
                    if delta > 0:
                        events.append(Event(
                            etype, severity,
                            {"netdev": netdev, "counter": counter, "delta": delta,
                             "dev": dev, "port": port},
                            f"{netdev}: {counter} +{delta}", device=netdev))
            entries.append(entry)
        self._tracker.retain({e["netdev"] for e in entries})
        names = {t[0] for t in targets}
        self._failing = {n: r for n, r in self._failing.items() if n in names}
        section: dict[str, Any] = {"netdevs": entries}
        if self._failing:
            section["unavailable"] = dict(self._failing)
        return Sample(section, events)

    def _stats(self, netdev: str) -> Mapping[str, int] | None:
        try:
            stats = self._read(netdev)
        except OSError as exc:
            reason = (exc.strerror or str(exc))[:512]
            if self._failing.get(netdev) != reason:
                self.ctx.log.warning("pfc: cannot read ethtool stats: %s", reason)
            self._failing[netdev] = reason
            return None
        if self._failing.pop(netdev, None) is not None:
            self.ctx.log.info("pfc: ethtool stats of %s readable again", netdev)
        return stats

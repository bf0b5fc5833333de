"""Host load and the agent's own footprint, from psutil (proc root injectable)."""
from __future__ import annotations

import time
from typing import Any, Mapping

import psutil

from .base import Collector, Context, OptionError, Sample


class HostCollector(Collector):
    name = "host"

    def __init__(self, ctx: Context, options: Mapping[str, Any]) -> None:
        super().__init__(ctx, options)
        if options:
            raise OptionError(f"collectors.host: takes no options, got {', '.join(options)}")
        # psutil reads /proc through this module-level setting (as node_exporter's --path.procfs)
        psutil.PROCFS_PATH = str(ctx.proc_root)
        self._me = psutil.Process()

    def start(self) -> None:
        psutil.cpu_percent(None)  # prime: the first call has no interval to measure
        self._me.cpu_percent(None)

    def collect(self, now: float) -> Sample:
        vm = psutil.virtual_memory()
        section: dict[str, Any] = {
            "cpu_pct": psutil.cpu_percent(None) * psutil.cpu_count(),
            "load1": psutil.getloadavg()[0],
            "mem_used_bytes": vm.total - vm.available,
            "mem_total_bytes": vm.total,
            "uptime_s": max(0.0, time.time() - psutil.boot_time()),
            "procs": len(psutil.pids()),
            "agent_rss_bytes": self._me.memory_info().rss,
            "agent_cpu_pct": self._me.cpu_percent(None),
        }
        return Sample(section=section)

"""`host` section: whole-host load and the agent's own footprint (psutil)."""
from __future__ import annotations

from ..schema import Float, Int, Record, U64

SECTION = Record(
    required={
        "cpu_pct": Float(0, 100 * 4096),
        "load1": Float(0, 1e6),
        "mem_used_bytes": U64,
        "mem_total_bytes": U64,
        "uptime_s": Float(0, 1e10),
    },
    optional={
        "procs": Int(0, 10**7),
        "agent_rss_bytes": U64,
        "agent_cpu_pct": Float(0, 100 * 4096),
    },
    doc={
        "cpu_pct": "host CPU busy over the interval, percent of one core times cores (0..100*ncpu)",
        "load1": "1-minute load average",
        "mem_used_bytes": "memory in use (total - available)",
        "mem_total_bytes": "physical memory",
        "uptime_s": "seconds since host boot",
        "procs": "number of processes",
        "agent_rss_bytes": "resident memory of the agent process",
        "agent_cpu_pct": "CPU of the agent process over the interval, percent of one core",
    },
)
EVENTS: dict[str, Record] = {}

"""The aggregator's TOML configuration (`c4 aggregator run --config aggregator.toml`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from c4.core.config import ConfigError, field


@dataclass
class AggregatorConfig:
    name: str = field("aggregator", "name the aggregator puts in the `host` of its frames")
    listen: str = field("tcp://0.0.0.0:9465", "ZeroMQ endpoint the ingest ROUTER binds "
                        "(agents connect here)")
    api: str = field("127.0.0.1:9464", "host:port of the HTTP JSON API and /metrics")
    db: Path = field(Path("/var/lib/c4/c4.db"), "SQLite database (WAL); `:memory:` for none")
    max_frame: int = field(1 << 20, "largest accepted frame in bytes (ZMQ_MAXMSGSIZE and "
                           "msgpack limits)")
    silent_after: float = field(0.0, "seconds without a frame before a host is marked silent; "
                                "0: five report intervals, at least 5 s")
    frames_retention_s: float = field(3600.0, "how long stored frames are kept (seconds)")
    topology: str = field("", "topology JSON file (c4/core/topology.py); empty: none")
    diagnosis: dict[str, Any] = field({}, "C4D thresholds (docs/diagnosis.md)")
    actions: dict[str, Any] = field({}, "action policy (docs/actions.md)")
    planning: dict[str, Any] = field({}, "C4P policy (docs/planning.md)")
    alerts: dict[str, Any] = field({}, "alert receivers: Alertmanager, PagerDuty, Slack, "
                                       "webhook (docs/operations.md#alerts)")
    metrics_host_counters: bool = field(False, "also export every up host's RDMA port counters "
                                        "on /metrics (`host` label); off: scrape the agents, "
                                        "which export them (docs/operations.md)")

    def validate(self, where: str) -> None:
        if not self.listen.startswith(("tcp://", "ipc://", "inproc://")):
            raise ConfigError(f"{where}listen: expected a ZeroMQ endpoint, got {self.listen!r}")
        host, _, port = self.api.rpartition(":")
        if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ConfigError(f"{where}api: expected host:port, got {self.api!r}")
        if not 1024 <= self.max_frame <= 64 << 20:
            raise ConfigError(f"{where}max_frame: must be between 1 KiB and 64 MiB")
        if self.silent_after < 0 or self.frames_retention_s <= 0:
            raise ConfigError(f"{where}silent_after/frames_retention_s: must not be negative")

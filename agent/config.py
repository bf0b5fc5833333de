"""The agent's TOML configuration (`c4 agent run --config agent.toml`); keys in docs/config.md."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from c4.core.config import ConfigError, field
from c4.core.keys import SECRET_SUFFIX, ClientKeys, KeyFileError

from .collectors import DEFAULT_ENABLED, REGISTRY


@dataclass
class AgentConfig:
    aggregator: str = field("tcp://127.0.0.1:9465",
                            "ZeroMQ endpoint of the aggregator's ingest socket")
    interval: float = field(1.0, "seconds between reports")
    server_public_key: str = field("/etc/c4/keys/server.key",
                                   "the aggregator's CURVE public key file (its `server.key`)")
    secret_key: str = field("", "this agent's CURVE secret key file, mode 0600 (`c4 keys "
                                "create --host NAME`); empty: /etc/c4/keys/<host>.key_secret. "
                                "Its public twin must be enrolled on the aggregator for `host`")
    insecure: bool = field(False, "plain TCP without CURVE (the aggregator must say "
                                  "`insecure = true` too). Only for tests on loopback")
    host: str = field("", "host name to report; empty: the system host name")
    hello_interval: float = field(300.0, "seconds between repeated `hello` frames, so an "
                                         "aggregator that lost its state, or a changed NIC "
                                         "inventory, is caught up without restarting the agent")
    sysfs_root: Path = field(Path("/sys"), "root of sysfs (a fixture tree in tests)")
    proc_root: Path = field(Path("/proc"), "root of procfs")
    dev_root: Path = field(Path("/dev"), "directory holding `kmsg`")
    run_dir: Path = field(Path("/run/c4"), "runtime directory (the plugin socket lives here)")
    queue_max: int = field(10000, "frames held for resending until acked; beyond it the oldest "
                                  "are dropped and counted")
    queue_bytes: int = field(64 << 20, "bytes of frames held for resending until acked (in "
                                       "memory and in the spool); beyond it the oldest are "
                                       "dropped and counted")
    spool_dir: str = field("", "directory of the on-disk copy of unacked frames, so a restarted "
                               "agent resends what its previous run had not delivered (e.g. "
                               "/var/lib/c4/spool); empty: memory only, a restart loses them")
    resend_after: float = field(5.0, "seconds without an ack before unacked frames are resent")
    max_frame: int = field(1 << 20, "largest frame in bytes, sent or received")
    validate_every: int = field(30, "check every Nth frame of each kind (and the first) against "
                                    "the wire schema before sending; 1: every frame. The "
                                    "aggregator checks all of them and answers errors, which "
                                    "the agent logs")
    labels: dict[str, str] = field({}, "free-form labels sent in `hello` (rack, scheduler node name)")
    metrics: str = field("0.0.0.0:9466", "host:port of the agent's Prometheus /metrics "
                         "(docs/operations.md); empty: no exporter")
    metrics_infiniband: bool = field(True, "export the RDMA port counters under node_exporter's "
                                     "`node_infiniband_*` names; false when node_exporter's "
                                     "infiniband collector runs on the host too")
    plan_tcp_wait: float = field(30.0, "seconds a C4P plan's TCP assignment waits for the "
                                 "application to reconnect on its planned port before "
                                 "plan_result reports it not applied (jobs reconnect at a "
                                 "step boundary); a QP's answer is waited for 2 s")
    bpf_stats: bool = field(True, "turn on the kernel's BPF run-time statistics while the agent "
                            "runs, for `c4_agent_bpf_program_run_*` (adds two clock reads to every program run)")
    collectors: dict[str, Any] = field(
        {}, "`enabled` (list of collector names, default all) and one `[collectors.<name>]` "
            "table of options per collector (docs/collectors.md)")

    def validate(self, where: str) -> None:
        if not 0.01 <= self.interval <= 3600:
            raise ConfigError(f"{where}interval: must be between 0.01 and 3600 seconds")
        if not self.aggregator.startswith(("tcp://", "ipc://", "inproc://")):
            raise ConfigError(f"{where}aggregator: expected a ZeroMQ endpoint like "
                              f"tcp://host:9465, got {self.aggregator!r}")
        if self.queue_max < 10:
            raise ConfigError(f"{where}queue_max: must be at least 10")
        if self.queue_bytes < self.max_frame:
            raise ConfigError(f"{where}queue_bytes: must be at least max_frame")
        if self.hello_interval < self.interval:
            raise ConfigError(f"{where}hello_interval: must be at least `interval`")
        if self.validate_every < 1:
            raise ConfigError(f"{where}validate_every: must be at least 1")
        if self.resend_after <= 0:
            raise ConfigError(f"{where}resend_after: must be positive")
        if not 0 < self.plan_tcp_wait <= 3600:
            raise ConfigError(f"{where}plan_tcp_wait: must be between 0 and 3600 seconds")
        if self.metrics:
            host, _, port = self.metrics.rpartition(":")
            if not port.isdigit() or not 0 <= int(port) <= 65535:
                raise ConfigError(f"{where}metrics: expected host:port (or empty), got "
                                  f"{self.metrics!r}")
        enabled = self.collectors.get("enabled", list(DEFAULT_ENABLED))
        if not isinstance(enabled, list) or not all(isinstance(n, str) for n in enabled):
            raise ConfigError(f"{where}collectors.enabled: expected a list of names")
        for name in list(enabled) + [k for k in self.collectors if k != "enabled"]:
            if name not in REGISTRY:
                raise ConfigError(f"{where}collectors: unknown collector {name!r}; known: "
                                  f"{', '.join(REGISTRY)}")
        for name, table in self.collectors.items():
            if name != "enabled" and not isinstance(table, dict):
                raise ConfigError(f"{where}collectors.{name}: expected a table of options")

    def curve_keys(self, host: str) -> ClientKeys | None:
        """The CURVE keys to connect with; None with `insecure = true`. Checked when the agent
        starts (ConfigError naming the key and the fix)."""
        if self.insecure:
            return None
        secret = self.secret_key or f"/etc/c4/keys/{host}{SECRET_SUFFIX}"
        try:
            return ClientKeys.load(self.server_public_key, secret)
        except KeyFileError as exc:
            raise ConfigError(
                f"CURVE keys (server_public_key, secret_key): {exc}; create this host's pair "
                f"with `c4 keys create --host {host}`, enroll its .key on the aggregator with "
                f"`c4 keys enroll --host {host} FILE`, copy the aggregator's server.key here, "
                f"or set `insecure = true` for plain TCP (tests on loopback only)") from None

    @property
    def enabled(self) -> list[str]:
        return list(self.collectors.get("enabled", DEFAULT_ENABLED))

    def options(self, name: str) -> dict[str, Any]:
        return dict(self.collectors.get(name, {}))

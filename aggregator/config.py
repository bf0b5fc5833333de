"""The aggregator's TOML configuration (`c4 aggregator run --config aggregator.toml`)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from c4.core.config import ConfigError, field
from c4.core.keys import KeyFileError, load_secret


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
    frames_retention_bytes: int = field(1 << 30, "raw frame bytes kept at most (oldest "
                                        "pruned first; the replay window is this divided by "
                                        "the ingest rate, docs/scaling.md)")
    max_hosts: int = field(20000, "hosts kept at most; a new host beyond it takes the place of "
                           "the one silent longest, or is rejected (`host_limit`) if none is")
    host_expiry_s: float = field(7 * 86400.0, "a host silent this long is forgotten (seconds)")
    topology: str = field("", "topology JSON file (c4/core/topology.py); empty: none")
    server_secret_key: str = field("/etc/c4/keys/server.key_secret",
                                   "the aggregator's CURVE secret key file, mode 0600 "
                                   "(`c4 keys create --server`); agents need its `.key` twin")
    enrolled_keys: str = field("/etc/c4/keys/enrolled",
                               "enrolled agent keys, one `host public-key` per line (`c4 keys "
                               "enroll`); re-read when it changes, no restart needed")
    insecure: bool = field(False, "plain TCP without CURVE: anyone who reaches `listen` can "
                                  "speak for any host. Only for tests on loopback; warned "
                                  "about at start")
    api_token_file: str = field("", "file holding the bearer token that state-changing HTTP "
                                    "requests (POST) must carry; empty: such requests are "
                                    "refused (403)")
    diagnosis: dict[str, Any] = field({}, "C4D thresholds (docs/diagnosis.md)")
    actions: dict[str, Any] = field({}, "action policy (docs/actions.md)")
    planning: dict[str, Any] = field({}, "C4P policy (docs/planning.md)")
    alerts: dict[str, Any] = field({}, "alert receivers: Alertmanager, PagerDuty, Slack, "
                                       "webhook (docs/operations.md#alerts)")
    federation: dict[str, Any] = field({}, "several aggregators, one per pod, and an owner "
                                       "per job that spans pods (docs/scaling.md); empty: "
                                       "off")
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
        if self.max_hosts < 1 or self.host_expiry_s <= 0:
            raise ConfigError(f"{where}max_hosts/host_expiry_s: must be positive")
        if self.frames_retention_bytes < 1 << 20:
            raise ConfigError(f"{where}frames_retention_bytes: must be at least 1 MiB")
        if self.silent_after < 0 or self.frames_retention_s <= 0:
            raise ConfigError(f"{where}silent_after/frames_retention_s: must not be negative")

    def curve_keys(self) -> tuple[bytes, bytes] | None:
        """The server's (public, secret) CURVE keys; None with `insecure = true`. Checked when
        the server starts, not at load: `c4 replay` reads the same file and needs no keys."""
        if self.insecure:
            return None
        how = ("create the aggregator's key pair with `c4 keys create --server --dir DIR` and "
               "enroll each agent's key with `c4 keys enroll`, or set `insecure = true` for "
               "plain TCP (tests on loopback only)")
        if not self.server_secret_key:
            raise ConfigError(f"server_secret_key is empty: {how}")
        try:
            return load_secret(self.server_secret_key)
        except KeyFileError as exc:
            raise ConfigError(f"server_secret_key: {exc}; {how}") from None

    def api_token(self) -> str | None:
        """The bearer token of state-changing requests, or None (they are refused)."""
        if not self.api_token_file:
            return None
        p = Path(self.api_token_file)
        try:
            mode = p.stat().st_mode
            token = p.read_text().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"api_token_file: cannot read {p}: {exc}") from None
        if mode & 0o077:
            raise ConfigError(f"api_token_file: {p} is accessible to others; run `chmod 600 {p}`")
        if len(token) < 16 or any(c.isspace() for c in token):
            raise ConfigError(f"api_token_file: {p} must hold one token of at least 16 "
                              f"characters (e.g. `openssl rand -hex 32`)")
        return token

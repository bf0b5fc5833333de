"""C4D thresholds: the aggregator config's `[diagnosis]` table (docs/diagnosis.md).

Defaults hold on clean runs of `c4 sim` with realistic noise (bench/diagnosis measures it):
raise them for jobs with long legitimate pauses (checkpoints) or very noisy fabrics.
"""
from __future__ import annotations

from dataclasses import dataclass

from c4.core.config import ConfigError, field
from c4.core.ordinals import STALL_S_DEFAULT


@dataclass
class DiagnosisConfig:
    hang_floor_s: float = field(
        STALL_S_DEFAULT, "a collective is hung when no rank made progress for at least this long (seconds, "
        "measured on each host) ...")
    hang_op_factor: float = field(
        10.0, "... and for at least this many times the communicator's recent time between "
        "completed collectives (the job's own pace)")
    checkpoint_s: float = field(
        60.0, "declared longest checkpoint: a rank alive but idle, not entering the collective "
        "its peers wait in (it writes a checkpoint), is a hang only after this long, or 1.5x "
        "the longest such pause the job recovered from, if longer (learned)")
    startup_grace_s: float = field(
        60.0, "a communicator's first collective is hung only after this long: ranks start it "
        "as they finish loading")
    stale_intervals: float = field(
        3.0, "a rank whose report is older than this many report intervals counts as missing")
    comm_expire_intervals: float = field(
        10.0, "a communicator not reported for this many intervals is forgotten (job ended or "
        "restarted)")
    comm_expire_max_s: float = field(
        300.0, "... and at the latest after this many seconds on the aggregator's clock, "
        "whatever report interval its agent claims")
    max_comms: int = field(
        50000, "communicators kept at most; a new one beyond this evicts the longest silent")
    host_expire_s: float = field(
        3600.0, "a host that sent nothing for this long is forgotten (its NICs, counters, "
        "flows) unless an open incident or a live communicator names it")
    slow_ratio: float = field(
        1.6, "a connection is slow when its network time per byte is at least this many times "
        "the communicator's baseline ...")
    slow_z: float = field(
        5.0, "... and at least this many robust standard deviations above it")
    slow_persist: int = field(
        3, "slow reports, among a connection's last `slow_window`, that make it persistently "
        "slow (a one-interval blip never does)")
    slow_window: int = field(4, "reports a connection's slowness is judged over")
    slow_hold_s: float = field(
        8.0, "... and for at least this long (seconds) without a break: another tenant's "
        "congestion burst (seconds) is not a broken link")
    min_cell_bytes: int = field(
        1 << 20, "a connection's report counts only if it moved at least this many bytes")
    min_cells: int = field(
        6, "connections with data a communicator needs before its baseline is trusted")
    tcp_min_hosts: int = field(
        4, "TCP flow diagnosis (jobs without the NCCL plugin) compares a job's connections "
        "only when its flows join at least this many hosts")
    tcp_min_bytes: int = field(
        1 << 20, "a host -> host TCP connection's interval counts only if the peer acknowledged "
        "at least this many bytes")
    tcp_retrans_per_mb: float = field(
        0.2, "a TCP connection is lossy only at or above this many retransmitted segments per "
        "MB acknowledged (and `slow_ratio` times the job's baseline)")
    localise_confidence: float = field(
        0.8, "top-suspect confidence (0..1) needed to declare an incident localised and call "
        "the action runner")
    localise_persist: int = field(
        2, "consecutive evaluations (ticks) the same top suspect must hold before localising")
    straggler_min_wait_s: float = field(
        0.02, "a straggler's peers must wait at least this long per collective at entry ...")
    straggler_ratio: float = field(
        3.0, "... and at least this many times longer than the straggler and than the "
        "communicator's median rank")
    straggler_op_share: float = field(
        0.15, "or: a straggler's collectives are shorter than every other rank's, and than "
        "their median by at least this share of it (and `straggler_min_wait_s`)")
    straggler_window: int = field(6, "reports of each rank a straggler is judged over")
    straggler_persist: int = field(
        5, "reports within the window that must show the straggler pattern (almost every op)")
    counter_ratio: float = field(
        10.0, "a NIC counter corroborates a slow connection when its rate is this many times "
        "the job's median NIC ...")
    counter_min_rate: float = field(50.0, "... and at least this many events per second")
    xid_ignore: list[int] = field(
        [13, 31, 43, 45, 63], "Xid codes that do not open an incident (application faults, "
        "process teardown, row-remap notices)")
    resolve_hold_s: float = field(
        60.0, "an incident resolves when its symptom has been absent this long (seconds)")
    event_hold_s: float = field(
        300.0, "hold-down for incidents that only events evidence (Xid, AER, flaps, pause "
        "storms): resolved this long after the last event")
    silent_confidence: float = field(
        0.6, "confidence of a silent host as the suspect when no stalled job points at it")
    memory_incidents: int = field(
        2000, "resolved incidents kept in memory for the API (all stay in SQLite)")

    def validate(self, where: str) -> None:
        p = f"{where}." if where else ""
        if self.checkpoint_s < 0 or self.startup_grace_s < 0:
            raise ConfigError(f"{p}checkpoint_s/startup_grace_s: must be >= 0")
        positive = ("hang_floor_s", "hang_op_factor", "stale_intervals", "comm_expire_intervals",
                    "comm_expire_max_s", "max_comms", "host_expire_s",
                    "slow_ratio", "slow_z", "straggler_min_wait_s", "straggler_ratio",
                    "counter_ratio", "resolve_hold_s", "event_hold_s", "tcp_retrans_per_mb",
                    "slow_hold_s")
        for name in positive:
            if getattr(self, name) <= 0:
                raise ConfigError(f"{p}{name}: must be > 0, got {getattr(self, name)}")
        if self.slow_ratio <= 1 or self.straggler_ratio <= 1:
            raise ConfigError(f"{p}slow_ratio/straggler_ratio: must be > 1")
        if not 0 < self.straggler_op_share < 1:
            raise ConfigError(f"{p}straggler_op_share: must be within (0, 1)")
        for name in ("localise_confidence", "silent_confidence"):
            if not 0 < getattr(self, name) <= 1:
                raise ConfigError(f"{p}{name}: must be within (0, 1]")
        for name in ("slow_persist", "slow_window", "localise_persist", "min_cells",
                     "straggler_window", "straggler_persist", "memory_incidents",
                     "tcp_min_hosts"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{p}{name}: must be >= 1")
        if self.slow_persist > self.slow_window:
            raise ConfigError(f"{p}slow_persist: cannot exceed slow_window ({self.slow_window})")
        if self.straggler_persist > self.straggler_window:
            raise ConfigError(f"{p}straggler_persist: cannot exceed straggler_window "
                              f"({self.straggler_window})")
        if self.comm_expire_intervals <= self.stale_intervals:
            raise ConfigError(f"{p}comm_expire_intervals: must exceed stale_intervals")
